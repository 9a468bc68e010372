"""What the worker's sample call costs, piece by piece, per config: microseconds per engine step
of vLLM's `sample_tokens` and the pieces inside it (its sampler, bookkeeping, the drafting hook
and treespec's proposer), with the model forward beside them for scale.

Why: served at sampled loads, a speculative server's extra time over no speculation is in its
worker's sample call, nowhere else measurable (docs/never-slower.md section 4,
`bench_matrix.py`'s step parts). That clock says how much, not where: this says where.

Method. Each (config, round) is one child process with an in-process engine (engine core and
worker in the process, bf16 as served, eager), which runs the prompts one at a time (one client;
`--batch N`: N at a time) after a warm-up. The pieces are timed by wrapping their functions with
a perf_counter pair (about 0.3 us per call on the 2-core VM, so a piece of a few calls per step
reads ~1 us high). Configs
take turns round by round, so the VM's drift hits each alike; the table shows each piece's median
over rounds. A config spec is a `bench_paired.py` spec; `SPEC@no-quiet` runs it with budget.gain's
quiet stretches turned off (engine/budget_control.py), `SPEC@no-tick` with their steps taken by
vLLM's speculative sample call and the proposer's full path (which skips them by
`BudgetControl.quiet_step`) instead of a plain sample call and `TreeProposer.take_quiet_step`,
`SPEC@one-by-one` with a stretch's catch-up made by one `decide_without_cap` call per step and
request (as before `GainControl.settle_quiet_steps`), for a before/after in one run.

    .venv/bin/python benchmarks/profile_sample_call.py --configs off \
        benchmarks/configs/drafting-off.yaml:24 lookup-online:24@no-quiet lookup-online:24 \
        --temperature 0.7 --output benchmarks/results/profile_sample_call_t07_code-lm.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

NO_QUIET = "@no-quiet"
NO_TICK = "@no-tick"
ONE_BY_ONE = "@one-by-one"
VARIANTS = (NO_QUIET, NO_TICK, ONE_BY_ONE)

# (what the table calls it, module, class or None, function); timed where it is looked up
PIECES: tuple[tuple[str, str, str | None, str], ...] = (
    ("execute call", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "execute_model"),
    ("  state update", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_update_states"),
    ("  input preparation", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_prepare_inputs"),
    ("  batch dispatch", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_determine_batch_execution_and_padding"),
    ("  attention metadata", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_build_attention_metadata"),
    ("  input ids", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_preprocess"),
    ("  model forward", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_model_forward"),
    ("sample call", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "sample_tokens"),
    ("  vLLM sampler", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_sample"),
    ("  bookkeeping", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_bookkeeping_sync"),
    ("  draft copy", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "_copy_draft_token_ids_to_cpu"),
    ("  draft handoff", "vllm_treespec.engine.runner_patches", None, "attach_drafts"),
    ("  quiet-step check", "vllm_treespec.engine.proposer", "TreeProposer", "takes_quiet_step"),
    ("  quiet step", "vllm_treespec.engine.proposer", "TreeProposer", "take_quiet_step"),
    ("  drafting hook", "vllm.v1.worker.gpu_model_runner", "GPUModelRunner", "propose_draft_token_ids"),
    ("    proposer step", "vllm_treespec.engine.proposer", "TreeProposer", "propose_step"),
    ("      step cost observation", "vllm_treespec.engine.budget_control", "BudgetControl", "observe_step"),
    ("        guard step", "vllm_treespec.engine.budget_control", "BudgetControl", "_guard_step"),
    ("        step cost fit", "vllm_treespec.budget.gain", "GainControl", "observe_step"),
    ("      batch rows", "vllm_treespec.engine.runner_state", None, "batch_tokens"),
    ("      step statistics", "vllm_treespec.engine.tree_stats", "TreeStats", "observe_step"),
    ("      drafting", "vllm_treespec.engine.proposer", "TreeProposer", "_propose"),
    ("        budget caps (full steps)", "vllm_treespec.engine.budget_control", "BudgetControl", "caps"),
    ("        quiet-stretch check", "vllm_treespec.engine.budget_control", "BudgetControl", "quiet_step"),
    ("        quiet-stretch catch-up", "vllm_treespec.engine.budget_control", "BudgetControl", "end_quiet"),
)


def _wrap(totals: dict[str, list], label: str, owner: Any, name: str) -> None:
    import functools

    original = getattr(owner, name)

    @functools.wraps(original)
    def timed(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            entry = totals[label]
            entry[0] += 1
            entry[1] += time.perf_counter() - start

    setattr(owner, name, timed)


def _child(spec: str, temperature: float, num_prompts: int, max_tokens: int, batch: int = 1) -> dict[str, Any]:
    """One engine, one pass over the prompts: per piece (calls, seconds), and the steps."""
    import importlib

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    import treespec_fixtures  # noqa: F401  (fixture paths and demo/ presets)
    from bench_paired import engine_kwargs, paired_prompts, resolved
    from treespec_fixtures import build_fixture
    from vllm import LLM, SamplingParams

    from vllm_treespec.engine.budget_control import BudgetControl
    from vllm_treespec.engine.proposer import TreeProposer

    if spec.endswith(NO_QUIET):
        BudgetControl._quiet_stretch = lambda self, *args: None
    elif spec.endswith(NO_TICK):
        TreeProposer.takes_quiet_step = lambda self, *args: False
    elif spec.endswith(ONE_BY_ONE):
        from vllm_treespec.budget.gain import GainControl

        GainControl.settle_quiet_steps = GainControl._settle_quiet_steps_one_by_one
    spec = _base_spec(spec)
    llm = LLM(model=str(build_fixture("code-lm")), enforce_eager=True, max_model_len=1024, seed=0,
              **resolved(engine_kwargs(spec)))
    # wrapped after the engine is built: over the plugin's runner patches, not under them
    totals: dict[str, list] = {label: [0, 0.0] for label, *_ in PIECES}
    for label, module, cls, name in PIECES:
        try:
            owner = importlib.import_module(module)
        except ImportError:
            continue
        _wrap(totals, label, getattr(owner, cls) if cls else owner, name)
    prompts = paired_prompts(num_prompts + batch + 1, unseen=True)
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True)
    llm.generate(prompts[:batch + 1], params, use_tqdm=False)       # warm-up
    for entry in totals.values():
        entry[0], entry[1] = 0, 0.0
    start = time.perf_counter()
    todo = prompts[batch + 1:]
    for i in range(0, len(todo), batch):                             # `batch` requests decoding together
        llm.generate(todo[i:i + batch], params, use_tqdm=False)
    return {"wall_s": time.perf_counter() - start, "steps": totals["sample call"][0],
            "pieces": {label: {"calls": n, "seconds": s} for label, (n, s) in totals.items()},
            "proposer": _proposer_counts(llm)}


def _proposer_counts(llm: Any) -> dict[str, Any] | None:
    """What the proposer decided over the whole run (warm-up included): its step kinds and
    budget.gain's decisions (engine/tree_stats.py); None without one."""
    runner = llm.llm_engine.model_executor.driver_worker.worker.model_runner
    stats = getattr(getattr(runner, "drafter", None), "stats", None)
    if stats is None:
        return None
    return {"step_kinds": dict(stats.step_kinds), "gain_decisions": dict(stats.gain_decisions)}


def _base_spec(spec: str) -> str:
    """The `bench_paired.py` spec of a config spec, its variant suffix removed."""
    for variant in VARIANTS:
        spec = spec.removesuffix(variant)
    return spec


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, float]]:
    """Per config, each piece's median over rounds of microseconds per engine step."""
    out = {}
    for spec, rounds in runs.items():
        out[spec] = {label: statistics.median(1e6 * r["pieces"][label]["seconds"] / max(r["steps"], 1)
                                              for r in rounds)
                     for label, *_ in PIECES}
    return out


def table(summary: dict[str, dict[str, float]]) -> str:
    specs = list(summary)
    lines = ["| piece (us per step) | " + " | ".join(specs) + " |", "| --- |" + " ---: |" * len(specs)]
    for label, *_ in PIECES:
        cells = [summary[s][label] for s in specs]
        if not any(cells):
            continue
        level = (len(label) - len(label.lstrip())) // 2          # nested in the piece above
        lines.append(f"| {'. ' * level}{label.strip()} | " + " | ".join(f"{c:.1f}" if c else "-" for c in cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--configs", nargs="+", default=["off", "lookup-online:24"])
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--num-prompts", type=int, default=32)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=1,
                    help="prompts generated together (a batch of that many decoding requests); 1: one client")
    ap.add_argument("--output", type=Path, default=None)
    ap.add_argument("--metrics", action="store_true",
                    help="keep the proposer's Prometheus series as a server does (a temporary "
                         "PROMETHEUS_MULTIPROC_DIR per engine); without it they are off, as offline")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ns = ap.parse_args(argv)
    if ns.child is not None:
        print(json.dumps(_child(ns.child, ns.temperature, ns.num_prompts, ns.max_tokens, ns.batch)))
        return 0

    from bench_paired import check_spec
    from harness.report import git_commit, hardware_info, software_info

    for spec in ns.configs:
        check_spec(_base_spec(spec))
    runs: dict[str, list[dict[str, Any]]] = {spec: [] for spec in ns.configs}
    for r in range(ns.rounds):
        for spec in ns.configs:
            with tempfile.TemporaryDirectory(prefix="profile_sample_call_metrics_") as metrics_dir:
                env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": metrics_dir} if ns.metrics else None
                out = subprocess.run([sys.executable, __file__, "--child", spec, "--temperature",
                                      str(ns.temperature), "--num-prompts", str(ns.num_prompts),
                                      "--max-tokens", str(ns.max_tokens), "--batch", str(ns.batch)],
                                     capture_output=True, text=True, check=False, env=env)
            if out.returncode != 0:
                sys.stderr.write(out.stderr[-4000:])
                raise SystemExit(f"{spec}: the engine process failed (rc {out.returncode})")
            runs[spec].append(json.loads(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1}/{ns.rounds} {spec}: {runs[spec][-1]['steps']} steps in "
                  f"{runs[spec][-1]['wall_s']:.2f} s", flush=True)
    summary = summarize(runs)
    record = {"benchmark": "profile_sample_call", "hardware": hardware_info(), "software": software_info(),
              "commit": git_commit(),
              "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(ns).items() if k != "child"},
              "runs": runs, "us_per_step_median": summary, "table_markdown": table(summary)}
    print(record["table_markdown"])
    if ns.output:
        ns.output.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
