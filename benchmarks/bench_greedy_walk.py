"""Greedy tree acceptance on the host: the argmax of every node row first, against the walk that
takes the argmax only at the rows it visits, side by side.

Why: served at 32 greedy clients on SmolLM2-135M-Instruct (bf16, Intel Xeon), the default's
worker spent 7.6 ms per step in its sample call against 1.3 ms for no speculation, most of it
outside drafting and vLLM's sampler (`bench_matrix_fresh_smollm2-135m.json`, parts table). The
greedy walk took vLLM's argmax over every verified row (49152 logits each, converted to float32
when served in bf16) before walking; under load most verified rows are rejected, so most of that
argmax was for rows the walk never reads. The walk now reads the logits itself
(csrc/verify/greedy_walk.cpp, `greedy_tree_walk_logits`): one argmax per visited row, the
accepted path and the row it stops at.

Cells: B requests each with a chain of `nodes` draft nodes (what the default's chain builder
drafts) of which `accepted` are accepted, vocab 49152 (SmolLM2's), logits float32 or bfloat16.
Both forms run on the same logits, calls interleaved, one torch thread (what vLLM's CPU worker
runs with); logits cycle through enough tensors that they do not stay in cache between calls.

    .venv/bin/python benchmarks/bench_greedy_walk.py --output benchmarks/results/bench_greedy_walk.json
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch
import vllm._custom_ops  # noqa: F401  registers torch.ops._C.greedy_argmax, which the worker's greedy_tokens uses

from harness.report import git_commit, hardware_info
from vllm_treespec.native import native
from vllm_treespec.tree import TreeBatch
from vllm_treespec.verify.greedy import greedy_walk
from vllm_treespec.verify.sampling_params import greedy_tokens

CACHE_BYTES = 256 << 20     # logits cycled per cell: more than any last-level cache here


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--nodes", type=int, nargs="+", default=[4, 12])
    p.add_argument("--accepted", type=int, nargs="+", default=[0, 2])
    p.add_argument("--vocab", type=int, default=49152)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=("float32", "bfloat16"))
    p.add_argument("--calls", type=int, default=40)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--output", type=Path, default=None)
    return p.parse_args(argv)


def chain_batch(batch: int, nodes: int, accepted: int, vocab: int, dtype: torch.dtype, seed: int
                ) -> tuple[TreeBatch, torch.Tensor]:
    """(B chains of `nodes` draft nodes after the root, logits [B * (nodes + 1), V]) where each
    chain's first `accepted` draft tokens are the target's argmax."""
    rng = np.random.default_rng(seed)
    size = nodes + 1
    tokens = rng.integers(vocab, size=batch * size)
    parents = np.tile(np.arange(-1, nodes), batch)
    tree = TreeBatch.from_arrays(np.arange(batch + 1) * size, tokens, parents)
    logits = torch.from_numpy(rng.standard_normal((batch * size, vocab), dtype=np.float32))
    for b in range(batch):
        for d in range(min(accepted, nodes)):
            logits[b * size + d, int(tokens[b * size + d + 1])] = 50.0
    return tree, logits.to(dtype)


def argmax_every_row(tree: TreeBatch, logits: torch.Tensor, width: int) -> np.ndarray:
    """The walk as the engine ran it before: vLLM's argmax of every row, then the C++ walk."""
    target = greedy_tokens(logits).to(torch.int64)
    _, _, count = native().greedy_tree_walk(tree.offsets.numpy(), tree.tokens.numpy(),
                                            tree.parents.numpy(), target.numpy(), width)
    return count


def argmax_visited_rows(tree: TreeBatch, logits: torch.Tensor, width: int) -> np.ndarray:
    return greedy_walk(tree, logits, width).num_emitted.numpy()


def time_cell(batch: int, nodes: int, accepted: int, vocab: int, dtype: torch.dtype, calls: int
              ) -> dict[str, float]:
    """Median ms per call of each form on one cell (the two forms alternate call by call)."""
    copies = []
    while not copies or sum(c[1].numel() * c[1].element_size() for c in copies) < CACHE_BYTES:
        copies.append(chain_batch(batch, nodes, accepted, vocab, dtype, seed=len(copies)))
        if len(copies) >= 64:
            break
    forms = {"every_row": argmax_every_row, "visited_rows": argmax_visited_rows}
    times: dict[str, list[float]] = {name: [] for name in forms}
    for i in range(calls):
        tree, logits = copies[i % len(copies)]
        for name, form in (forms.items() if i % 2 else reversed(forms.items())):
            start = time.perf_counter()
            count = form(tree, logits, nodes + 1)
            times[name].append(time.perf_counter() - start)
            if not (count == accepted + 1).all():
                raise RuntimeError(f"{name}: emitted {count.tolist()}, expected {accepted + 1} per request")
    return {name: 1e3 * statistics.median(t[calls // 5:]) for name, t in times.items()}


def main(argv: list[str] | None = None) -> None:
    ns = parse_args(argv)
    torch.set_num_threads(1)
    cells = [(b, n, a, d) for d in ns.dtypes for b in ns.batch for n in ns.nodes for a in ns.accepted if a <= n]
    ms: dict[tuple, dict[str, list[float]]] = {c: {"every_row": [], "visited_rows": []} for c in cells}
    for _ in range(ns.rounds):
        for cell in cells:
            b, n, a, d = cell
            for name, value in time_cell(b, n, a, ns.vocab, getattr(torch, d), ns.calls).items():
                ms[cell][name].append(value)
    rows = []
    print(f"{'dtype':>8} {'batch':>5} {'nodes':>5} {'accepted':>8} {'every row ms':>12} {'visited ms':>10} {'ratio':>6}")
    for (b, n, a, d), per in ms.items():
        every, visited = statistics.median(per["every_row"]), statistics.median(per["visited_rows"])
        rows.append({"dtype": d, "batch": b, "nodes": n, "accepted": a, "every_row_ms": every,
                     "visited_rows_ms": visited, "speedup": every / visited,
                     "rounds_every_row_ms": per["every_row"], "rounds_visited_rows_ms": per["visited_rows"]})
        print(f"{d:>8} {b:>5} {n:>5} {a:>8} {every:>12.3f} {visited:>10.3f} {every / visited:>5.2f}x")
    if ns.output:
        ns.output.write_text(json.dumps({
            "benchmark": "bench_greedy_walk", "hardware": hardware_info(), "commit": git_commit(),
            "settings": {"vocab": ns.vocab, "calls": ns.calls, "rounds": ns.rounds, "torch_threads": 1},
            "results": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
