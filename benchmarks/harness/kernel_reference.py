"""Torch references for the kernels of vllm_treespec/kernels (the tests' ground truth and
bench_kernels' sanity check; no Triton).

They are written the plain way and read nothing the kernels compute: attention visibility is
walked from ``parents`` (not decoded from the ancestor bitmask) and evaluated in float64;
compaction gathers every source before writing any destination (always alias-safe); greedy
acceptance is tests/support/greedy_reference.py (see tests/test_kernels_tree_accept.py).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["ancestor_matrix", "paged_tree_attention_reference", "compact_kv_reference"]


def ancestor_matrix(parents: torch.Tensor) -> torch.Tensor:
    """bool ``[n, n]``: entry (i, j) is set iff local node j is i or one of i's ancestors."""
    parents = parents.to(torch.int64).cpu()
    n = parents.numel()
    anc = torch.eye(n, dtype=torch.bool)
    rows = torch.arange(n)
    node = rows.clone()
    while True:
        up = parents[node.clamp(min=0)]
        up = torch.where(node >= 0, up, -1)
        if not bool((up >= 0).any()):
            return anc
        anc[rows[up >= 0], up[up >= 0]] = True
        node = up


def paged_tree_attention_reference(query: torch.Tensor, key_cache: torch.Tensor,
                                   value_cache: torch.Tensor, block_table: torch.Tensor,
                                   prefix_lens: torch.Tensor, q_offsets: torch.Tensor,
                                   parents: torch.Tensor, scale: float, *,
                                   causal: torch.Tensor | None = None,
                                   logits_soft_cap: float | None = None) -> torch.Tensor:
    """float64 ``[T, Hq, D]`` (on query's device): per request, gather its prefix and tree K/V
    through the block table, mask densely, softmax. Caches ``[num_blocks, block_size, Hkv, D]``;
    ``parents`` local (-1 at roots); ``causal`` requests see tree keys j <= i instead."""
    t, hq, d = query.shape
    bs, hkv = key_cache.shape[1], key_cache.shape[2]
    g = hq // hkv
    out = torch.full((t, hq, d), float("nan"), dtype=torch.float64, device=query.device)
    offsets = q_offsets.tolist()
    prefixes = prefix_lens.tolist()
    for r in range(len(offsets) - 1):
        start, stop = offsets[r], offsets[r + 1]
        n, p = stop - start, prefixes[r]
        pos = torch.arange(p + n, device=key_cache.device)
        blk = block_table[r].to(torch.int64)[pos // bs]
        k = key_cache[blk, pos % bs].double()                     # [L, Hkv, D]
        v = value_cache[blk, pos % bs].double()
        vis = torch.zeros(n, p + n, dtype=torch.bool)
        vis[:, :p] = True
        if causal is not None and bool(causal[r]):
            vis[:, p:] = torch.ones(n, n, dtype=torch.bool).tril()
        else:
            vis[:, p:] = ancestor_matrix(parents[start:stop])
        q = query[start:stop].double().view(n, hkv, g, d)
        s = torch.einsum("nhgd,lhd->hgnl", q, k) * scale
        if logits_soft_cap:
            s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
        s = s.masked_fill(~vis.to(s.device), float("-inf"))
        o = torch.einsum("hgnl,lhd->nhgd", torch.softmax(s, dim=-1), v)
        out[start:stop] = o.reshape(n, hq, d)
    return out


def compact_kv_reference(caches: Sequence[torch.Tensor], src_slots: torch.Tensor,
                         dst_slots: torch.Tensor) -> None:
    """In place, every cache ``[num_blocks, block_size, Hkv, D]``: slot dst <- old slot src.

    Pairs are flat (any order; entries < 0 skipped), as ``verify.kv_compaction`` produces them;
    every source is read before any destination is written, as in ``compact_kv``.
    """
    src = src_slots.reshape(-1).to(torch.int64)
    dst = dst_slots.reshape(-1).to(torch.int64)
    keep = (src >= 0) & (dst >= 0)
    src, dst = src[keep], dst[keep]
    for cache in caches:
        bs = cache.shape[1]
        moved = cache[src // bs, src % bs].clone()
        cache[dst // bs, dst % bs] = moved
