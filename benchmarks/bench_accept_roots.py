"""accept() on a step in which no request drafted: the root-only path against the general walk.

Why: vLLM 0.32 runs its speculative path every step once `--speculative-config` is set, so a
step whose requests all drafted nothing (budget 0 under load, a drafter without a match) still
goes through tree acceptance as root-only trees. Sampled requests made that cost about 0.5 ms of
a 2.5 ms worker step under cProfile (`profile_offline.py ... --temperature 0.7`), most of it the
tree layout and the per-level bookkeeping of a walk that stops at the root. The root-only path
(verify/accept.py `_accept_roots`) draws the same coins and token; the walk is timed here by
switching that path off. One torch thread (what vLLM's CPU worker leaves), vocab 4096 (the
code-LM fixture's), temperature 0.7, seeded requests as the engine passes them:

    .venv/bin/python benchmarks/bench_accept_roots.py --output benchmarks/results/bench_accept_roots.json
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--calls", type=int, default=600)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--output", type=Path, default=None)
    return p.parse_args(argv)


def time_accept(batch: int, vocab: int, calls: int, walk: bool) -> float:
    """Median ms of one accept() call on `batch` root-only trees (walk=True: the general walk)."""
    accept_module = importlib.import_module("vllm_treespec.verify.accept")   # the package exports
    # a function of the same name
    from vllm_treespec.verify import SamplingParamsBatch, accept

    logits = torch.randn(batch, vocab, generator=torch.Generator().manual_seed(batch))
    tree = (torch.arange(batch + 1), torch.zeros(batch, dtype=torch.int64), torch.full((batch,), -1),
            torch.zeros(batch, dtype=torch.int64))
    params = SamplingParamsBatch.from_lists([0.7] * batch)
    gens = [torch.Generator().manual_seed(b) for b in range(batch)]
    root_only = accept_module._root_only_offsets
    if walk:
        accept_module._root_only_offsets = lambda tree, device: None
    try:
        times = []
        for i in range(calls):
            start = time.perf_counter()
            accept(tree, logits, mode="target_only", sampling=params, generators=gens, max_depth=4,
                   coin_rows=5)
            times.append(time.perf_counter() - start)
    finally:
        accept_module._root_only_offsets = root_only
    return 1e3 * statistics.median(times[calls // 6:])


def main(argv: list[str] | None = None) -> int:
    from harness.report import hardware_info, hardware_line, software_info

    ns = parse_args(argv)
    torch.set_num_threads(1)
    hw = hardware_info()
    print(hardware_line(hw), "torch threads 1", flush=True)
    rows = []
    for rnd in range(ns.rounds):
        for batch in ns.batch:
            for walk in (True, False):
                ms = time_accept(batch, ns.vocab, ns.calls, walk)
                rows.append({"round": rnd, "batch": batch, "path": "walk" if walk else "root_only", "ms": ms})
                print(f"round {rnd} batch {batch:3d} {'walk' if walk else 'root-only':9s} {ms:.3f} ms", flush=True)
    summary = {}
    for batch in ns.batch:
        med = {p: statistics.median(r["ms"] for r in rows if r["batch"] == batch and r["path"] == p)
               for p in ("walk", "root_only")}
        summary[str(batch)] = {**{f"{p}_ms": v for p, v in med.items()},
                               "root_only_over_walk": med["root_only"] / med["walk"]}
    print(json.dumps(summary, indent=1))
    if ns.output is not None:
        ns.output.write_text(json.dumps({"benchmark": "bench_accept_roots", "hardware": hw,
                                         "software": software_info(), "torch_threads": 1,
                                         "vocab": ns.vocab, "temperature": 0.7, "calls": ns.calls,
                                         "summary": summary, "rows": rows}, indent=2) + "\n")
        print(f"wrote {ns.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
