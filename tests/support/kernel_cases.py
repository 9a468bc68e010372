"""Random paged-KV verification cases for the kernel tests (no Triton), and a poison fill that
shows what a kernel forgets to write. Whether Triton can run here: benchmarks/harness/triton_mode.py.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["PagedTreeCase", "paged_tree_case", "poison_"]


def poison_(x: torch.Tensor) -> torch.Tensor:
    """Fill with NaN (floats) or -7 (ints) so that anything a kernel forgets to write shows."""
    return x.fill_(float("nan") if x.dtype.is_floating_point else -7)


@dataclass
class PagedTreeCase:
    """One random verification step over a FlashAttention-layout paged cache."""
    query: torch.Tensor          # [T, Hq, D]
    key_cache: torch.Tensor      # [num_blocks, block_size, Hkv, D], NaN where nobody wrote
    value_cache: torch.Tensor
    block_table: torch.Tensor    # int32 [B, width], shuffled blocks, junk past each request
    prefix_lens: torch.Tensor    # int64 [B]
    q_offsets: torch.Tensor      # int64 [B+1]
    parents: torch.Tensor        # int64 [T], local, -1 at roots
    anc_mask: torch.Tensor       # int64 [T, W]
    causal: torch.Tensor         # bool [B]


def paged_tree_case(seed: int, sizes: list[int], prefixes: list[int], hq: int, hkv: int,
                    head_dim: int, dtype: torch.dtype, block_size: int,
                    causal: list[bool] | None = None, device: str = "cpu") -> PagedTreeCase:
    """Random trees (chains for ``causal`` requests), a shuffled block table and a cache where
    exactly each request's prefix + tree slots hold data; every other slot is NaN."""
    from harness.paged_cache import random_block_table
    from harness.random_trees import random_tree
    from vllm_treespec.tree import DraftTree, TreeBatch

    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    causal = causal or [False] * len(sizes)
    trees = [DraftTree.chain(1, list(range(2, n + 1))) if c else
             random_tree(rng, n - 1, max_children=int(rng.integers(1, 5)))
             for n, c in zip(sizes, causal)]
    batch = TreeBatch.from_trees(trees)
    anc = batch.anc_mask.clone()
    for r, c in enumerate(causal):      # causal rows must not be read: make them poison
        if c:
            anc[batch.request_rows(r)] = -1
    need = [-(-(p + n) // block_size) for p, n in zip(prefixes, sizes)]
    num_blocks = sum(need) + 3
    table = random_block_table(gen, need, num_blocks, max(need) + 2)
    shape = (num_blocks, block_size, hkv, head_dim)
    k = torch.full(shape, float("nan"), dtype=dtype)
    v = torch.full(shape, float("nan"), dtype=dtype)
    for r, (p, n) in enumerate(zip(prefixes, sizes)):
        pos = torch.arange(p + n)
        blk = table[r].to(torch.int64)[pos // block_size]
        k[blk, pos % block_size] = torch.randn(p + n, hkv, head_dim, generator=gen).to(dtype)
        v[blk, pos % block_size] = torch.randn(p + n, hkv, head_dim, generator=gen).to(dtype)
    query = torch.randn(batch.num_rows, hq, head_dim, generator=gen).to(dtype)
    dev = torch.device(device)
    return PagedTreeCase(query.to(dev), k.to(dev), v.to(dev), table.to(dev),
                         torch.tensor(prefixes, dtype=torch.int64, device=dev),
                         batch.offsets.to(dev), batch.parents.to(dev), anc.to(dev),
                         torch.tensor(causal, device=dev))
