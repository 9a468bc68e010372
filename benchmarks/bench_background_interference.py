"""What a background fixture builder costs the test session beside it (vllm_treespec/fixtures/background.py).

Times a few draft-LM training steps (the fixture's own recipe and its two torch threads, fewer
steps, in a child process: what the session does when it builds draft-lm itself) alone, beside
a one-thread CPU-bound task at nice 10, and beside the same task in the SCHED_IDLE class, in
rotation, `--repeats` each. A two-thread step waits at each OpenMP barrier for its second
thread; beside a merely niced task that thread waits to be scheduled.

    .venv/bin/python benchmarks/bench_background_interference.py \
        --output benchmarks/results/bench_background_interference.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_TRAIN = """
import dataclasses, json, sys, time
from vllm_treespec.fixtures.code_lm import (DRAFT_LM_RECIPE as R, DRAFT_SHAPE, DRAFT_TRAIN, load_tokens,
                                            new_model, tokenizer_dir)
from vllm_treespec.fixtures.train_lm import train
cfg = dataclasses.replace(DRAFT_TRAIN, steps=int(sys.argv[1]))
eos = json.loads((tokenizer_dir() / "fixture.json").read_text())["eos_token_id"]
model = new_model(DRAFT_SHAPE, eos, seed=R["init_seed"], init_std=R["init_std"])
tokens = load_tokens("train")
start = time.perf_counter()
train(model, tokens, cfg, "draft-lm-bench")
print(json.dumps({"seconds": time.perf_counter() - start, "threads": cfg.threads}))
"""
# one torch thread of matrix products, like a head fixture training in the background
_HOG = "import torch\ntorch.set_num_threads(1)\na = torch.randn(384, 384)\nwhile True:\n    a = (a @ a).tanh()\n"


def _start_hog(mode: str) -> subprocess.Popen | None:
    if mode == "alone":
        return None

    def demote() -> None:
        if mode == "nice10":
            os.nice(10)
        else:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))

    hog = subprocess.Popen([sys.executable, "-c", _HOG], preexec_fn=demote, env={**os.environ, "OMP_NUM_THREADS": "1"})
    time.sleep(2.0)
    return hog


def train_steps(mode: str, steps: int) -> dict:
    hog = _start_hog(mode)
    try:
        out = subprocess.run([sys.executable, "-c", _TRAIN, str(steps)], capture_output=True, text=True,
                             check=True, cwd=ROOT)
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--output", type=Path, default=None)
    ns = p.parse_args(argv)
    from vllm_treespec.fixtures import build_fixture
    from vllm_treespec.report import hardware_info, hardware_line, software_info

    build_fixture("code-lm")                       # tokenizer and token shards of the draft-LM recipe
    hw = hardware_info()
    print(hardware_line(hw), flush=True)
    runs: dict[str, list[float]] = {"alone": [], "nice10": [], "sched_idle": []}
    for _ in range(ns.repeats):
        for mode in runs:
            runs[mode].append(train_steps(mode, ns.steps)["seconds"])
            print(f"draft-lm {ns.steps} steps {mode:10s}: {runs[mode][-1]:.1f} s", flush=True)
    median = {m: statistics.median(s) for m, s in runs.items()}
    record = {"benchmark": "bench_background_interference", "hardware": hw, "software": software_info(),
              "draft_lm_steps": ns.steps, "seconds": runs, "median_s": median,
              "slowdown_vs_alone": {m: median[m] / median["alone"] for m in runs}}
    print(json.dumps(record["slowdown_vs_alone"]))
    if ns.output:
        ns.output.write_text(json.dumps(record, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
