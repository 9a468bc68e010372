"""Sampled tree acceptance on the host: the native walk against the torch walk, side by side.

Why: a sampled speculative step spent ~1.8 ms in verification on the code-LM fixture
(docs/never-slower.md section 5), most of it the torch walk's layout pass and per-level ops,
not arithmetic. `accept_target_only` on CPU now runs one native walk
(csrc/verify/sampled_walk.cpp); the torch walk (`verify.accept._target_only_torch`, the path for
device logits) is timed here on the same batches, calls interleaved round by round. One torch
thread (what vLLM's CPU worker leaves), vocab 4096 (the code-LM fixture's), temperature 0.7 and
no filters (the serving default), trees from `harness.accept_latency.synthetic_batch` (logits
peaked on a child, so walks go deep); nodes 1 = root-only steps (there the torch walk's draw is
already the native row draw, so the pair times the orchestration around it):

    .venv/bin/python benchmarks/bench_sampled_walk.py --output benchmarks/results/bench_sampled_walk.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from harness.accept_latency import synthetic_batch
from harness.report import git_commit, hardware_info
from vllm_treespec.verify import SamplingParamsBatch
from vllm_treespec.verify.accept import _target_only_native, _target_only_torch


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--nodes", type=int, nargs="+", default=[1, 6, 16])
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--calls", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--output", type=Path, default=None)
    return p.parse_args(argv)


def time_walk(walk, batch: int, nodes: int, vocab: int, temperature: float, seeded: bool,
              calls: int) -> tuple[float, float]:
    """(median ms per call, mean tokens emitted per request) of one walk on one batch."""
    tree, logits, _ = synthetic_batch(batch, nodes, vocab, seed=batch * 100 + nodes)
    params = SamplingParamsBatch.from_lists([temperature] * batch)
    times, emitted = [], 0.0
    for i in range(calls):
        gens = [torch.Generator().manual_seed(i * batch + b) for b in range(batch)] if seeded else None
        start = time.perf_counter()
        res = walk(tree, logits, params, gens, nodes, nodes + 1)
        times.append(time.perf_counter() - start)
        emitted += float(res.num_emitted.float().mean())
    return 1e3 * statistics.median(times[calls // 6:]), emitted / calls


def main(argv: list[str] | None = None) -> None:
    ns = parse_args(argv)
    torch.set_num_threads(1)
    walks = {"native": _target_only_native, "torch": _target_only_torch}
    cells = [(b, n, s) for b in ns.batch for n in ns.nodes for s in (False, True)]
    ms: dict[tuple, dict[str, list[float]]] = {c: {w: [] for w in walks} for c in cells}
    tokens: dict[tuple, float] = {}
    for _ in range(ns.rounds):
        for cell in cells:
            for name, walk in walks.items():
                t, tau = time_walk(walk, *cell[:2], ns.vocab, ns.temperature, cell[2], ns.calls)
                ms[cell][name].append(t)
                tokens[cell] = tau
    rows = []
    print(f"{'batch':>5} {'nodes':>5} {'seeded':>6} {'native ms':>10} {'torch ms':>9} {'speedup':>8} {'tokens':>7}")
    for (b, n, s), per in ms.items():
        native, torch_ = statistics.median(per["native"]), statistics.median(per["torch"])
        rows.append({"batch": b, "nodes": n, "seeded": s, "native_ms": native, "torch_ms": torch_,
                     "speedup": torch_ / native, "tokens_per_request": tokens[(b, n, s)],
                     "rounds_native_ms": per["native"], "rounds_torch_ms": per["torch"]})
        print(f"{b:>5} {n:>5} {str(s):>6} {native:>10.3f} {torch_:>9.3f} {torch_ / native:>7.2f}x "
              f"{tokens[(b, n, s)]:>7.2f}")
    if ns.output:
        ns.output.write_text(json.dumps({
            "benchmark": "bench_sampled_walk", "hardware": hardware_info(), "commit": git_commit(),
            "settings": {"vocab": ns.vocab, "temperature": ns.temperature, "calls": ns.calls,
                         "rounds": ns.rounds, "torch_threads": 1},
            "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
