"""Drafting time per step vs context length for the draft-model drafters (no vLLM engine).

For each drafter (the transformer draft-lm and the Mamba draft fixtures) and each context
length, requests with held-out code contexts of that length draft a static (3, 2, 2, 1) tree
per step (one catch-up call + one call per level), then commit 3 tokens, for --steps steps
after warm-up; the median drafting time per step is reported. The Mamba drafter's recurrent state
does not grow with context, so its time should stay flat (issue 7 target: within 10% from 256
to 2048 tokens); the transformer's attention over its KV cache grows with context.

    .venv/bin/python benchmarks/bench_draft_lm.py                   # batch 1 and 8, 256..2048
    .venv/bin/python benchmarks/bench_draft_lm.py --batch 1 --contexts 256 2048 --steps 20

Writes JSON + PNG to benchmarks/results/ (hardware and torch threads in the record).
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

import numpy as np

RESULTS_DIR = Path(__file__).resolve().parent / "results"
DRAFTERS = {"transformer draft-lm": "fixture:draft-lm", "mamba draft": "fixture:mamba-draft-lm"}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 512, 1024, 2048])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8])
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    p.add_argument("--output", type=Path, default=None)
    return p.parse_args(argv)


def _contexts(batch: int, length: int, rng: np.random.Generator) -> list[np.ndarray]:
    from treespec_fixtures.code_lm import load_tokens

    held = load_tokens("held").numpy()
    starts = rng.integers(0, held.shape[0] - length - 1, size=batch)
    return [held[s:s + length].astype(np.int64) for s in starts]


def measure(path: str, batch: int, length: int, steps: int, warmup: int) -> float:
    """Median seconds of one drafting step (catch-up + tree levels) for `batch` requests."""
    from vllm_treespec.config import parse_config
    from vllm_treespec.drafters import DraftInputs, make_drafter

    cfg = parse_config({"drafter": {"type": "draft_model", "path": path, "max_cached_requests": batch},
                        "tree": {"builder": "static", "template": [3, 2, 2, 1]}})
    drafter = make_drafter(cfg.drafter, None, cfg.tree, max_model_len=length + 4 * (steps + warmup) + 8,
                           max_nodes=16)
    rng = np.random.default_rng(length)
    ctx = _contexts(batch, length, rng)
    width = length + 4 * (steps + warmup) + 8
    times = []
    for step in range(warmup + steps):
        buf = np.zeros((batch, width), dtype=np.int32)
        for i, c in enumerate(ctx):
            buf[i, :c.shape[0]] = c
        inputs = DraftInputs(req_ids=[f"r{i}" for i in range(batch)], token_ids=buf, rows=np.arange(batch),
                             num_tokens=np.array([c.shape[0] for c in ctx]), budgets=np.full(batch, 16))
        t = time.perf_counter()
        trees = drafter.propose(inputs).trees
        if step >= warmup:
            times.append(time.perf_counter() - t)
        # commit the first chain's first two tokens (or fewer) plus a bonus token
        ctx = [np.concatenate([c, tr.tokens[1:3], [int(rng.integers(1, 4000))]]).astype(np.int64)
               for c, tr in zip(ctx, trees)]
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    import torch

    from harness.report import hardware_info, hardware_line, software_info

    ns = parse_args(argv)
    if ns.threads:
        torch.set_num_threads(ns.threads)
    hw = hardware_info()
    print(hardware_line(hw), f"torch threads {torch.get_num_threads()}", flush=True)
    rows = []
    for name, path in DRAFTERS.items():
        for b in ns.batch:
            for length in ns.contexts:
                s = measure(path, b, length, ns.steps, ns.warmup)
                rows.append({"drafter": name, "batch": b, "context": length, "ms_per_step": 1e3 * s})
                print(f"{name:22s} batch {b:2d} context {length:5d}: {1e3 * s:7.2f} ms per drafting step",
                      flush=True)
    for name in DRAFTERS:
        for b in ns.batch:
            ms = [r["ms_per_step"] for r in rows if r["drafter"] == name and r["batch"] == b]
            print(f"{name:22s} batch {b:2d}: longest / shortest context = {ms[-1] / ms[0]:.2f}x")
    started = dt.datetime.now(dt.timezone.utc)
    out = ns.output or RESULTS_DIR / "bench_draft_lm.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"benchmark": "bench_draft_lm", "started_utc": started.isoformat(timespec="seconds"),
                               "hardware": hw, "software": software_info(),
                               "torch_threads": torch.get_num_threads(), "template": [3, 2, 2, 1],
                               "steps": ns.steps, "warmup": ns.warmup, "rows": rows}, indent=2) + "\n")
    _plot(rows, out.with_suffix(".png"), hardware_line(hw))
    print(f"wrote {out}")
    return 0


def _plot(rows: list[dict], path: Path, hw: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4))
    for name in DRAFTERS:
        for b in sorted({r["batch"] for r in rows}):
            pts = [(r["context"], r["ms_per_step"]) for r in rows if r["drafter"] == name and r["batch"] == b]
            ax.plot(*zip(*pts), marker="o", label=f"{name}, batch {b}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("context tokens")
    ax.set_ylabel("ms per drafting step (template 3-2-2-1)")
    ax.set_title(f"bench_draft_lm, {hw}", fontsize=8)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
