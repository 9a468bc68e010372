"""What an engine step costs, part by part: model forward, logits, tree acceptance, drafting and
budget control, step plan, metadata, scheduler; in milliseconds per step and per speculative step.

Why: a speculative step costs more outside the model than a plain one (greedy at one client 4.0
against 2.0 ms, `bench_paired`), and at sampled loads each of the default's rare probe steps pays
that fixed cost for a fraction of a token (docs/never-slower.md section 4). Cutting it needs to
know which parts it is made of, measured the same way before and after.

Method. Each config gets an offline engine in its own process (engine in-process, fp32, as
`bench_paired.py`); the engines take turns prompt by prompt, so the VM's drift hits every config
alike. After a warm-up, `py-spy record` samples each engine process for the whole run (an engine
waiting for its turn is idle and yields no samples). Each sample inside an engine step is
assigned to the innermost frame that names a part (`PARTS`; what matches none is "rest of the
step"); a part's milliseconds per step are its share of the step samples times the engine's
measured seconds per step. Engine steps are counted, and a step is speculative when the
scheduler sent drafts in it. For a config that drafts, "extra per speculative step" is its part's
ms per step minus the first config's (normally `off`), divided by its share of speculative steps:
what one speculative step adds to that part, assuming its plain steps cost what the reference's
do (the free-idle pair measures them within 2%).

    .venv/bin/python benchmarks/profile_step_parts.py --configs off lookup-online:24 --unseen
    .venv/bin/python benchmarks/profile_step_parts.py --configs off \
        benchmarks/configs/lookup-online-probe-every-step.yaml:24 --temperature 0.7 --unseeded \
        --unseen --output benchmarks/results/profile_step_parts_t07_probe_every_step_code-lm.json

Configs are `bench_paired.py` specs. Needs py-spy (`pip install py-spy`; --py-spy PATH if it is
not on PATH). Writes a JSON record and prints a markdown table.
"""
from __future__ import annotations

import treespec_fixtures  # noqa: F401  (fixture: paths and demo/ presets, here and in the engines)
import argparse
import collections
import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

# (part, function-name fragments). A sample belongs to the innermost frame matching a fragment;
# the order here only names the parts in the table.
PARTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("model forward", ("GPUModelRunner._model_forward",)),
    ("logits", (".compute_logits",)),
    ("tree acceptance", ("TreeProposer.sample",)),
    ("budget control", ("BudgetControl.",)),
    ("drafter", ("TreeProposer._propose",)),
    ("proposer, rest", ("TreeProposer.propose_step",)),
    ("step plan", ("TreeProposer.plan_step",)),
    ("vLLM sampler", ("GPUModelRunner._sample",)),
    ("spec-decode metadata", ("GPUModelRunner._calc_spec_decode_metadata",)),
    ("attention metadata", ("GPUModelRunner._build_attention_metadata",)),
    ("input preparation", ("GPUModelRunner._prepare_inputs",)),
    ("state update", ("GPUModelRunner._update_states",)),
    ("bookkeeping", ("GPUModelRunner._bookkeeping_sync",)),
    ("scheduler", ("Scheduler.schedule", "Scheduler.update_from_output")),
)
REST = "rest of the step"
STEP_FRAME = "EngineCore.step"


def classify(raw: str) -> tuple[collections.Counter, int]:
    """py-spy collapsed stacks ('frame;frame;... count') -> samples per part inside engine steps,
    and the number of such samples."""
    parts: collections.Counter = collections.Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        names = [frame.split(" (")[0] for frame in stack.split(";")]
        if not any(name.startswith(STEP_FRAME) for name in names):
            continue
        n = int(count)
        total += n
        parts[_innermost_part(names)] += n
    return parts, total


def _innermost_part(names: list[str]) -> str:
    for name in reversed(names):
        for part, fragments in PARTS:
            if any(fragment in name for fragment in fragments):
                return part
    return REST


def _serve(conn: Any, kwargs: dict[str, Any], model: str, max_tokens: int, temperature: float,
           seeded: bool) -> None:
    """Child process: one engine; answers (prompts, seeds) with (seconds, steps, speculative
    steps) until None."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    llm = LLM(model=model, dtype="float32", enforce_eager=True, max_model_len=1024, seed=0, **kwargs)
    engine, counts = llm.llm_engine, {"steps": 0, "speculative": 0}
    engine_step, execute_model = engine.step, GPUModelRunner.execute_model

    def counted_step() -> Any:
        counts["steps"] += 1
        return engine_step()

    def counted_execute(self: Any, scheduler_output: Any, *args: Any, **kw: Any) -> Any:
        if getattr(scheduler_output, "scheduled_spec_decode_tokens", None):
            counts["speculative"] += 1
        return execute_model(self, scheduler_output, *args, **kw)

    engine.step = counted_step
    GPUModelRunner.execute_model = counted_execute
    conn.send(os.getpid())
    while (request := conn.recv()) is not None:
        batch, seeds = request
        params = [SamplingParams(temperature=temperature, seed=seed if temperature > 0 and seeded else None,
                                 max_tokens=max_tokens, ignore_eos=True) for seed in seeds]
        counts.update(steps=0, speculative=0)
        start = time.perf_counter()
        llm.generate(batch, params, use_tqdm=False)
        conn.send((time.perf_counter() - start, counts["steps"], counts["speculative"]))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", nargs="+", required=True, metavar="SPEC",
                   help="bench_paired.py config specs; the first is the reference (normally off)")
    p.add_argument("--fixture", default="code-lm")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--passes", type=int, default=3, help="times each prompt is run by each config")
    p.add_argument("--concurrency", type=int, default=1)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--unseeded", action="store_true", help="sampled requests carry no seed")
    p.add_argument("--unseen", action="store_true", help="prompts from benchmarks/unseen_prompts.py")
    p.add_argument("--rate", type=int, default=250, help="py-spy samples per second")
    p.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    p.add_argument("--output", type=Path, default=None, help="JSON record path")
    ns = p.parse_args(argv)
    from bench_paired import check_spec

    for spec in ns.configs:
        try:
            check_spec(spec)
        except (ValueError, json.JSONDecodeError) as e:
            p.error(str(e))
    if shutil.which(ns.py_spy) is None and not Path(ns.py_spy).is_file():
        p.error(f"py-spy not found at {ns.py_spy!r}: pip install py-spy, or pass --py-spy PATH")
    return ns


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    from bench_paired import engine_kwargs, paired_prompts, resolved
    from treespec_fixtures import build_fixture
    from treespec_fixtures.prebuild import prebuild_engine_fixtures

    model = str(build_fixture(ns.fixture))
    for spec in ns.configs:
        prebuild_engine_fixtures(engine_kwargs(spec), model)
    prompts = paired_prompts(ns.num_prompts, ns.unseen)
    batches = [prompts[i:i + ns.concurrency] for i in range(0, len(prompts), ns.concurrency)]
    ctx = mp.get_context("spawn")
    engines = []
    for spec in ns.configs:                 # one warm-up at a time
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_serve, args=(child, resolved(engine_kwargs(spec)), model, ns.max_tokens,
                                                     ns.temperature, not ns.unseeded), daemon=True)
        proc.start()
        child.close()
        pid = parent.recv()
        parent.send((prompts[:1], [0]))     # warm-up
        parent.recv()
        engines.append((spec, parent, proc, pid))
    out_dir = Path(tempfile.mkdtemp(prefix="step_parts_"))
    spies = []
    for i, (_, _, _, pid) in enumerate(engines):
        raw = out_dir / f"engine{i}.txt"
        spies.append((raw, subprocess.Popen(
            [ns.py_spy, "record", "--pid", str(pid), "--rate", str(ns.rate), "--format", "raw",
             "--output", str(raw), "--nonblocking"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)))
    time.sleep(2.0)                         # py-spy attaches
    totals = [{"seconds": 0.0, "steps": 0, "speculative": 0} for _ in engines]
    for p in range(ns.passes):
        for b, batch in enumerate(batches):
            order = list(range(len(engines)))
            if (p + b) % 2:
                order.reverse()             # alternate who goes first
            for i in order:
                engines[i][1].send((batch, [1000 * p + b * ns.concurrency + j for j in range(len(batch))]))
                seconds, steps, speculative = engines[i][1].recv()
                totals[i]["seconds"] += seconds
                totals[i]["steps"] += steps
                totals[i]["speculative"] += speculative
    for _, spy in spies:
        spy.send_signal(2)                  # SIGINT: py-spy writes what it has
        spy.communicate(timeout=60)
    for _, parent, proc, _ in engines:
        parent.send(None)
        proc.join(timeout=60)
    record = _record(ns, engines, spies, totals, len(prompts))
    print(table(record))
    if ns.output:
        ns.output.parent.mkdir(parents=True, exist_ok=True)
        ns.output.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {ns.output}")
    return 0


def _record(ns: argparse.Namespace, engines: list, spies: list, totals: list[dict], num_prompts: int) -> dict:
    from harness.report import git_commit, hardware_info, software_info

    configs = []
    for (spec, *_), (raw, _), total in zip(engines, spies, totals):
        text = raw.read_text() if raw.exists() else ""
        if not text:
            raise SystemExit(f"py-spy recorded nothing for {spec}")
        parts, samples = classify(text)
        ms_per_step = 1e3 * total["seconds"] / max(total["steps"], 1)
        configs.append({
            "config": spec, "tokens": ns.passes * num_prompts * ns.max_tokens, **total,
            "ms_per_step": ms_per_step, "step_samples": samples,
            "speculative_share": total["speculative"] / max(total["steps"], 1),
            "parts_ms_per_step": {part: ms_per_step * n / samples for part, n in parts.items()},
        })
    reference = configs[0]
    for c in configs[1:]:
        share = c["speculative_share"] - reference["speculative_share"]
        if share > 0.01:
            c["extra_ms_per_speculative_step"] = {
                part: (ms - reference["parts_ms_per_step"].get(part, 0.0)) / share
                for part, ms in c["parts_ms_per_step"].items()}
    return {"benchmark": "profile_step_parts", "hardware": hardware_info(), "software": software_info(),
            "commit": git_commit(), "fixture": ns.fixture, "unseen_prompts": ns.unseen,
            "prompts": num_prompts, "max_tokens": ns.max_tokens, "passes": ns.passes,
            "concurrency": ns.concurrency, "temperature": ns.temperature,
            "seeded": ns.temperature > 0 and not ns.unseeded, "py_spy_rate": ns.rate,
            "rerun": "benchmarks/profile_step_parts.py " + " ".join(sys.argv[1:]), "configs": configs}


def table(record: dict) -> str:
    """Markdown: ms per step of each part per config, and the extra per speculative step."""
    configs = record["configs"]
    names = [part for part, _ in PARTS] + [REST]
    extra = [c for c in configs if "extra_ms_per_speculative_step" in c]
    head = [c["config"] for c in configs] + [f"extra per spec. step, {c['config']}" for c in extra]
    lines = ["ms per engine step", "", "| part | " + " | ".join(head) + " |", "| --- |" + " ---: |" * len(head)]
    for part in names:
        cells = [c["parts_ms_per_step"].get(part, 0.0) for c in configs]
        cells += [c["extra_ms_per_speculative_step"].get(part, 0.0) for c in extra]
        lines.append(f"| {part} | " + " | ".join(f"{v:.3f}" for v in cells) + " |")
    totals = [c["ms_per_step"] for c in configs] + [sum(c["extra_ms_per_speculative_step"].values()) for c in extra]
    lines.append("| **step** | " + " | ".join(f"**{v:.3f}**" for v in totals) + " |")
    lines += ["", "| | " + " | ".join(c["config"] for c in configs) + " |", "| --- |" + " ---: |" * len(configs),
              "| steps | " + " | ".join(str(c["steps"]) for c in configs) + " |",
              "| speculative share | " + " | ".join(f"{c['speculative_share']:.3f}" for c in configs) + " |",
              "| tokens / step | " + " | ".join(f"{c['tokens'] / max(c['steps'], 1):.2f}" for c in configs) + " |",
              "| step samples | " + " | ".join(str(c["step_samples"]) for c in configs) + " |"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
