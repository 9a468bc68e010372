"""Two costs that decide how long the test suite takes on a fresh 2-core machine.

1. Fixture training on one core vs all cores. vLLM's CPU worker pins itself to one core here
   (the other is reserved for the engine core) and runs torch with one thread, so a fixture first
   resolved inside the worker trains that way. Times a few Mamba draft-LM training steps (the
   fixture's own recipe, fewer steps, in a child process each) pinned to core 0 with one torch
   thread, and unpinned with the recipe's threads. This is why fixtures are built before engines
   start (benchmarks/treespec_fixtures/prebuild.py).
2. One end-to-end engine run of the tiny fixture (tests/e2e.py `run_engine`: a fresh process,
   16 short greedy requests) with vLLM's engine core and worker in their own spawned processes
   vs inside the runner (VLLM_ENABLE_V1_MULTIPROCESSING=0), alternating, `--repeats` each.

    .venv/bin/python benchmarks/bench_ci_costs.py --output benchmarks/results/bench_ci_costs.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))       # tests/e2e.py: the suite's own engine runner

_TRAIN = """
import dataclasses, json, os, sys, time
pin = sys.argv[1] == "pinned"
if pin:
    os.sched_setaffinity(0, {0})
from treespec_fixtures.code_lm import load_tokens, tokenizer_dir
from treespec_fixtures.mamba_lm import MAMBA_DRAFT_LM_RECIPE as R, MAMBA_SHAPE, MAMBA_TRAIN, new_model
from treespec_fixtures.train_lm import train
cfg = dataclasses.replace(MAMBA_TRAIN, steps=int(sys.argv[2]), threads=1 if pin else MAMBA_TRAIN.threads)
eos = json.loads((tokenizer_dir() / "fixture.json").read_text())["eos_token_id"]
model = new_model(MAMBA_SHAPE, eos, seed=R["init_seed"], init_std=R["init_std"],
                  scaled_residual_init=R["scaled_residual_init"])
tokens = load_tokens("train")
start = time.perf_counter()
stats = train(model, tokens, cfg, "mamba-" + sys.argv[1])
print(json.dumps({"seconds": time.perf_counter() - start, "final_loss": stats["final_train_loss"]}))
"""


def train_steps(mode: str, steps: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _TRAIN, mode, str(steps)], capture_output=True, text=True,
                         check=True, cwd=ROOT)
    return json.loads(out.stdout.strip().splitlines()[-1])


def engine_run(multiprocess: bool) -> dict:
    from e2e import greedy, run_engine

    from treespec_fixtures import build_fixture

    prompts = ["def fibonacci(n):\n    ", "import os\n", "class Config:\n", "x = [1, 2, 3]\n"] * 4
    engine = dict(dtype="float32", enforce_eager=True, max_model_len=512, max_num_seqs=8, seed=0)
    phases = [{"name": "c8", "concurrency": 8, "prompts": prompts, "sampling": [greedy(24)] * len(prompts)}]
    start = time.perf_counter()
    result = run_engine(build_fixture("tiny"), engine, phases, multiprocess=multiprocess)
    return {"seconds": time.perf_counter() - start, "startup_s": result["startup_s"],
            "generate_s": sum(p["seconds"] for p in result["phases"])}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--train-steps", type=int, default=120)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--output", type=Path, default=None)
    ns = p.parse_args(argv)
    from treespec_fixtures import build_fixture
    from harness.report import hardware_info, hardware_line, software_info

    build_fixture("code-lm")                       # tokenizer and token shards of the Mamba recipe
    hw = hardware_info()
    print(hardware_line(hw), flush=True)
    training = {mode: train_steps(mode, ns.train_steps) for mode in ("pinned", "all_cores")}
    for mode, r in training.items():
        print(f"mamba {ns.train_steps} steps {mode:9s}: {r['seconds']:.1f} s (final loss {r['final_loss']:.3f})")
    runs: dict[str, list[dict]] = {"spawned": [], "in_process": []}
    for _ in range(ns.repeats):
        for mode in runs:
            runs[mode].append(engine_run(mode == "spawned"))
            r = runs[mode][-1]
            print(f"tiny engine run {mode:10s}: {r['seconds']:.1f} s (startup {r['startup_s']:.1f} s, "
                  f"generate {r['generate_s']:.1f} s)", flush=True)
    record = {"benchmark": "bench_ci_costs", "hardware": hw, "software": software_info(),
              "mamba_train_steps": ns.train_steps, "mamba_training": training,
              "engine_runs": runs,
              "engine_run_median_s": {m: statistics.median(r["seconds"] for r in rs) for m, rs in runs.items()}}
    if ns.output:
        ns.output.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
