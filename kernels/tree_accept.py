"""Greedy tree acceptance on the GPU (Triton): one program per request, no host sync.

The greedy rule of ``verify.greedy`` (the device half of its ``greedy_walk``) given the target's
argmax at every node row: from the root, emit the argmax x of the current node's row; if a child
of the node carries token x, descend into it, else stop (x is the bonus token). Siblings carry distinct tokens, so the child
is unique. A program keeps its request's parents and tokens in registers (BLOCK_N >= its node
count) and finds each level's child with one vectorised compare, so the walk costs depth + 1
scalar loads of the argmax and no children table.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

__all__ = ["greedy_tree_accept"]


@triton.jit
def _greedy_accept_kernel(offsets, tokens, parents, target, emitted, nodes, num_emitted,
                          width, stride_e, stride_n, BLOCK_N: tl.constexpr):
    r = tl.program_id(0)
    start = tl.load(offsets + r).to(tl.int64)
    n = (tl.load(offsets + r + 1).to(tl.int64) - start).to(tl.int32)
    idx = tl.arange(0, BLOCK_N)
    ok = idx < n
    par = tl.load(parents + start + idx, mask=ok, other=-2).to(tl.int32)
    tok = tl.load(tokens + start + idx, mask=ok, other=-1).to(tl.int64)
    cur = tl.zeros([], dtype=tl.int32)          # local index of the current node
    active = tl.full([], 1, dtype=tl.int1)
    count = tl.zeros([], dtype=tl.int64)
    for level in range(0, width):
        x = tl.load(target + start + cur).to(tl.int64)
        tl.store(emitted + r * stride_e + level, tl.where(active, x, -1))
        hit = (par == cur) & (tok == x)
        child = tl.min(tl.where(hit, idx, BLOCK_N), 0)
        descend = active & (child < BLOCK_N) & (level + 1 < width)
        tl.store(nodes + r * stride_n + level, tl.where(descend, child.to(tl.int64), -1))
        count += active.to(tl.int64)
        active = descend
        cur = tl.where(descend, child, cur)
    tl.store(num_emitted + r, count)


def greedy_tree_accept(offsets: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                       target_tokens: torch.Tensor, width: int, *, max_nodes: int | None = None
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(emitted [B, width], accepted_nodes [B, width], num_emitted [B]), int64, -1 padded.

    offsets: int [B+1] flat tree batch offsets; tokens / parents: int [T] (parents local, -1 at
    roots); target_tokens: int [T] argmax of the target's logits at each node row
    (``verify.sampling_params.greedy_tokens``); width: output columns, normally max depth + 1
    (a path is cut at width tokens, as csrc/verify/greedy_walk.cpp does). ``accepted_nodes``
    holds local node indices without the root, as ``AcceptResult.accepted_nodes``; the bonus
    token is ``emitted[b, num_emitted[b] - 1]``. max_nodes: bound on nodes per request (the
    step's budget + 1); computed from offsets (a host sync) when omitted.
    """
    b = offsets.numel() - 1
    dev = tokens.device
    emitted = torch.empty(b, width, dtype=torch.int64, device=dev)
    nodes = torch.empty(b, width, dtype=torch.int64, device=dev)
    count = torch.empty(b, dtype=torch.int64, device=dev)
    if b == 0:
        return emitted, nodes, count
    if width < 1:
        raise ValueError("width must be >= 1 (the bonus token)")
    if max_nodes is None:
        max_nodes = int((offsets[1:] - offsets[:-1]).max())
    block_n = max(16, triton.next_power_of_2(max_nodes))
    _greedy_accept_kernel[(b,)](offsets, tokens, parents, target_tokens, emitted, nodes, count,
                                width, emitted.stride(0), nodes.stride(0), BLOCK_N=block_n)
    return emitted, nodes, count
