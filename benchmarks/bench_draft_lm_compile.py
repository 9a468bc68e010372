"""Would capturing the draft LM's forward in a graph pay? Eager vs `torch.compile` (inductor) of
the transformer draft runtime's `_forward`, one request, one torch thread.

Why: drafters/lm/NOTES.md left "fuse the layer or capture it in a graph" as the next step for
the draft LM, whose ~60 small torch ops per call cost more than their arithmetic. This measures
the gain and what it costs to get: the compile time of the first step and the recompiles that
new shapes trigger.

Per step, as in serving at one client: a greedy 4-token chain, i.e. the catch-up call over 3
committed tokens (its last row gives the first token) and 3 `extend` calls. Timed twice: back to
back, and with the code-LM target's HF forward over 5 rows before each step, as in the engine
where every drafting step follows the target's forward. Modes run interleaved for `--rounds`.
The record was written with an empty inductor cache, so its compile times are a cold start's:

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) .venv/bin/python benchmarks/bench_draft_lm_compile.py \
        --rounds 3 --output benchmarks/results/bench_draft_lm_compile.json
"""
from __future__ import annotations

import treespec_fixtures  # noqa: F401  (fixture: paths and demo/ presets, here and in servers)
import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch

CONTEXT = 300
LEVELS = 4


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--output", type=Path, default=None)
    return p.parse_args(argv)


def draft_lm(max_len: int):
    """The draft-lm fixture in the transformer runtime, sized for one request."""
    from vllm_treespec.drafters.lm.loading import DraftModelSpec, load_draft_lm

    return load_draft_lm(DraftModelSpec("fixture:draft-lm", "auto", 2048, 1), served_tokenizer=None,
                         max_len=max_len, max_tree_nodes=LEVELS + 1)


def target_forward() -> Callable[[], None]:
    """The code-LM target's HF forward over 5 rows: the work that precedes drafting in the engine."""
    from transformers import AutoModelForCausalLM

    from treespec_fixtures import build_fixture

    model = AutoModelForCausalLM.from_pretrained(build_fixture("code-lm")).eval()
    ids = torch.arange(5).unsqueeze(0) + 100

    def run() -> None:
        with torch.inference_mode():
            model(ids)
    return run


def run_steps(lm, held: np.ndarray, steps: int, gap: Callable[[], None] | None) -> tuple[list[float], list[list[int]]]:
    """Seconds per drafting step (a LEVELS-token chain: catch-up + LEVELS - 1 extends) and the chains."""
    lm.admit(["r"])
    ctx = held[:CONTEXT].copy()
    times, chains = [], []
    for s in range(steps):
        if gap is not None:
            gap()
        start = time.perf_counter()
        tok = int(lm.start_step(["r"], [ctx])[-1].argmax())
        chain = [tok]
        for level in range(LEVELS - 1):
            tok = int(lm.extend(np.array([0]), np.array([level]), np.array([tok]))[-1].argmax())
            chain.append(tok)
        times.append(time.perf_counter() - start)
        chains.append(chain)
        ctx = np.concatenate([ctx, held[CONTEXT + 3 * s: CONTEXT + 3 * s + 3]])
    lm.release(["r"])
    return times, chains


def main(argv: list[str] | None = None) -> int:
    from treespec_fixtures.code_lm import load_tokens
    from harness.report import hardware_info, hardware_line, software_info

    ns = parse_args(argv)
    torch.set_num_threads(1)            # what vLLM's CPU worker leaves the drafter (lm/NOTES.md)
    hw = hardware_info()
    print(hardware_line(hw), "torch threads 1", flush=True)
    held = load_tokens("held").numpy().astype(np.int64)
    lm = draft_lm(CONTEXT + 3 * (ns.warmup + ns.steps) + LEVELS + 1)
    eager_forward = lm._forward
    gap = target_forward()
    from torch._dynamo.utils import counters

    compiled_forward = torch.compile(eager_forward, dynamic=True)
    lm._forward = compiled_forward
    start = time.perf_counter()
    run_steps(lm, held, 1, None)
    compile_s = time.perf_counter() - start
    first_warm, _ = run_steps(lm, held, 3, None)
    print(f"compiled: first step {compile_s:.1f} s (compiles), next steps "
          f"{', '.join(f'{t:.2f}' for t in first_warm)} s", flush=True)

    rows, chains = [], {}
    for rnd in range(ns.rounds):
        for mode, forward in (("eager", eager_forward), ("compiled", compiled_forward)):
            lm._forward = forward
            for with_gap in (False, True):
                times, drafted = run_steps(lm, held, ns.warmup + ns.steps, gap if with_gap else None)
                ms = 1e3 * statistics.median(times[ns.warmup:])
                chains.setdefault(mode, drafted)
                rows.append({"round": rnd, "mode": mode, "target_forward_before": with_gap,
                             "ms_per_step": ms})
                print(f"round {rnd} {mode:8s} target forward before: {str(with_gap):5s} "
                      f"{ms:6.3f} ms per step ({LEVELS}-token chain)", flush=True)
    agree = float(np.mean([a == b for a, b in zip(chains["eager"], chains["compiled"])]))
    graphs = int(counters["stats"]["unique_graphs"])
    summary = {}
    for with_gap in (False, True):
        med = {m: statistics.median(r["ms_per_step"] for r in rows
                                    if r["mode"] == m and r["target_forward_before"] == with_gap)
               for m in ("eager", "compiled")}
        summary["after_target_forward" if with_gap else "back_to_back"] = {
            **{f"{m}_ms": v for m, v in med.items()}, "compiled_over_eager": med["compiled"] / med["eager"]}
    print(json.dumps(summary, indent=1))
    print(f"compiled graphs: {graphs}; drafted chains equal in {agree:.0%} of steps")
    out = ns.output or Path(__file__).resolve().parent / "results" / "bench_draft_lm_compile.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({
        "benchmark": "bench_draft_lm_compile",
        "started_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "hardware": hw, "software": software_info(), "torch_threads": 1,
        "context": CONTEXT, "levels": LEVELS, "steps": ns.steps, "warmup": ns.warmup,
        "first_compiled_step_s": compile_s, "next_compiled_steps_s": first_warm,
        "compiled_graphs": graphs, "chains_equal_fraction": agree,
        "summary": summary, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
