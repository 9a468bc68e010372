"""What budget.gain sees and decides: one offline engine (in-process) on unseen prompts at a fixed
concurrency, then the proposer's gain state read directly (measured costs, probe schedule, tree
sizes). For diagnosing decisions, not a speed comparison (no paired baseline: use bench_matrix).

    .venv/bin/python benchmarks/probe_gain.py --temperature 0.7 --concurrency 8 \
        --output benchmarks/results/probe_gain_t07_c8_code-lm.json
"""
from __future__ import annotations

import treespec_fixtures  # noqa: F401  (fixture: paths and demo/ presets, here and in servers)
import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"      # the proposer lives in this process
sys.path.insert(0, str(Path(__file__).resolve().parent))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="prompt-lookup")
    ap.add_argument("-k", type=int, default=12)
    ap.add_argument("--temperature", type=float, default=0.7)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--num-prompts", type=int, default=40)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--output", type=Path, default=None)
    ns = ap.parse_args(argv)

    from vllm import LLM, SamplingParams

    from unseen_prompts import build_prompts
    from treespec_fixtures import build_fixture
    from harness.report import hardware_info, software_info

    model = str(build_fixture("code-lm"))
    prompts = [p.text for p in build_prompts(ns.num_prompts + 4, seed=5)]
    llm = LLM(model=model, max_model_len=1024, enforce_eager=True, seed=0,
              speculative_config={"model": "vllm_treespec.TreeProposer", "num_speculative_tokens": ns.k},
              additional_config={"treespec": ns.preset})
    sp = SamplingParams(temperature=ns.temperature, max_tokens=ns.max_tokens, ignore_eos=True)
    llm.generate(prompts[:4], sp, use_tqdm=False)                        # warm-up
    start, tokens = time.perf_counter(), 0
    for i in range(4, len(prompts), ns.concurrency):
        outs = llm.generate(prompts[i:i + ns.concurrency], sp, use_tqdm=False)
        tokens += sum(len(o.outputs[0].token_ids) for o in outs)
    seconds = time.perf_counter() - start
    proposer = llm.llm_engine.model_executor.driver_worker.worker.model_runner.drafter
    gain = proposer.budget.gain
    if gain is None:
        raise SystemExit(f"preset {ns.preset!r} has budget.gain off: nothing to probe")
    fit = gain.cost.coefficients()
    stats = proposer.stats.summary()
    record = {
        "benchmark": "probe_gain", "hardware": hardware_info(), "software": software_info(),
        "settings": vars(ns) | {"output": str(ns.output) if ns.output else None},
        "tokens_per_s": tokens / seconds,
        "step_cost_ms": {"base": 1e3 * fit.base, "per_request": 1e3 * fit.request, "per_row": 1e3 * fit.row,
                         "speculative_overhead": 1e3 * fit.speculative},
        "rate_tokens_per_s": gain.cost.tokens_per_second(),
        "measured_costs_tokens": gain.measured_costs()._asdict(),
        "drafter_ms_per_drafting_request": 1e3 * gain._drafter_seconds,
        "stats": {k: stats[k] for k in ("draft_steps", "draft_ms_per_step", "mean_budget", "verify_steps", "verify_ms_per_step",
                                        "worker_step_ms", "verified_trees", "mean_accepted", "nodes_hist",
                                        "gain_decisions", "step_kinds", "shadow_probes", "shadow_accepted")},
    }
    print(json.dumps(record, indent=1))
    if ns.output:
        ns.output.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
