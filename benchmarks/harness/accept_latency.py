"""Per-call latency of each acceptance rule on synthetic trees (used by benchmarks/bench_tree.py):
"greedy" is the greedy walk (greedy.py), the others `accept` in that mode.

Trees are random with ``nodes`` rows per request (parents drawn among the previous 8 nodes, so
trees are a few levels deep like budgeted draft trees); target logits are peaked on one child per
node so walks go deep, which is the expensive case. Sampled modes default to temperature 0.8,
top-k 50, top-p 0.95: top-p takes vLLM's sort-based filter path, one full-vocabulary sort per
visited row, which dominates; pass top_p=1.0 to see the cost of the rules themselves.

    python benchmarks/harness/accept_latency.py [THREADS]
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence

import torch

from vllm_treespec.tree import TreeBatch
from vllm_treespec.verify.accept import MODES, accept
from vllm_treespec.verify.greedy import greedy_walk
from vllm_treespec.verify.result import AcceptResult
from vllm_treespec.verify.sampling_params import SamplingParamsBatch

RULES: tuple[str, ...] = ("greedy", *MODES)


def synthetic_batch(
    batch_size: int, nodes: int, vocab: int, seed: int = 0
) -> tuple[TreeBatch, torch.Tensor, torch.Tensor]:
    """(tree, logits [T, V], draft_probs [T, V]) with distinct sibling tokens."""
    g = torch.Generator().manual_seed(seed)
    local = torch.arange(nodes)
    lo = (local - 8).clamp(min=0)
    parents = lo + (torch.rand(batch_size, nodes, generator=g) * (local - lo)).long()
    parents[:, 0] = -1
    # distinct sibling tokens: token = (parent-specific offset + index) mod vocab
    tokens = (parents.clamp(min=0) * 7919 + local) % vocab
    rows = batch_size * nodes
    logits = torch.randn(rows, vocab, generator=g)
    is_draft = parents >= 0
    flat_parent = (parents + (torch.arange(batch_size) * nodes).unsqueeze(1))[is_draft]
    logits[flat_parent, tokens[is_draft]] += 6.0
    draft = torch.softmax(logits + torch.randn(rows, vocab, generator=g), dim=-1)
    tree = TreeBatch.from_arrays(torch.arange(batch_size + 1) * nodes, tokens.reshape(-1),
                                 parents.reshape(-1))
    return tree, logits, draft


def accept_latency(
    batch_sizes: Sequence[int] = (1, 16, 64),
    nodes: int = 64,
    vocab: int = 32000,
    modes: Sequence[str] = RULES,
    repeats: int = 5,
    seed: int = 0,
    threads: int | None = None,
    temperature: float = 0.8,
    top_k: int = 50,
    top_p: float = 0.95,
) -> dict:
    """Median latency (ms) of one acceptance call per rule and batch size, plus mean emitted
    tokens.

    ``threads`` sets torch's intra-op threads for the run (restored after); None keeps them.
    Returns {"device", "nodes", "vocab", "threads", "results": {mode: {batch_size: {...}}}}.
    """
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _measure(
            batch_sizes, nodes, vocab, modes, repeats, seed, (temperature, top_k, top_p)
        )
    finally:
        torch.set_num_threads(before)


def _measure(batch_sizes, nodes, vocab, modes, repeats, seed, sampling_args) -> dict:
    temperature, top_k, top_p = sampling_args
    out: dict = {
        "device": "cpu",
        "nodes": nodes,
        "vocab": vocab,
        "threads": torch.get_num_threads(),
        "sampling": {"temperature": temperature, "top_k": top_k, "top_p": top_p},
        "results": {},
    }
    for mode in modes:
        per_mode = {}
        for bsz in batch_sizes:
            tree, logits, draft = synthetic_batch(bsz, nodes, vocab, seed)
            sampling = SamplingParamsBatch.from_lists(
                [temperature] * bsz, top_k=[top_k] * bsz, top_p=[top_p] * bsz
            )
            run = _rule(mode, tree, logits, draft, sampling, torch.Generator().manual_seed(seed))
            run()  # warm-up
            times = []
            emitted = 0.0
            for _ in range(repeats):
                start = time.perf_counter()
                res = run()
                times.append((time.perf_counter() - start) * 1e3)
                emitted += float(res.num_emitted.float().mean())
            times.sort()
            per_mode[bsz] = {
                "median_ms": times[len(times) // 2],
                "min_ms": times[0],
                "mean_emitted": emitted / repeats,
            }
            del tree, logits, draft
        out["results"][mode] = per_mode
    return out


def _rule(mode: str, tree: TreeBatch, logits: torch.Tensor, draft: torch.Tensor,
          sampling: SamplingParamsBatch, gen: torch.Generator) -> Callable[[], AcceptResult]:
    """One call of the rule named mode on this batch (the greedy walk takes its full depth)."""
    if mode == "greedy":
        width = int(tree.offsets[1] - tree.offsets[0])
        return lambda: greedy_walk(tree, logits, width)
    kwargs: dict = dict(mode=mode, sampling=sampling, generators=gen)
    if mode == "rrs":
        kwargs.update(draft_probs=draft, replacement=False)
    return lambda: accept(tree, logits, **kwargs)


if __name__ == "__main__":
    import sys

    threads = int(sys.argv[1]) if len(sys.argv) > 1 else None
    print(json.dumps(accept_latency(threads=threads), indent=2))
