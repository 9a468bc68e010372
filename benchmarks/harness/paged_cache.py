"""Paged KV caches laid out the way vLLM's backends lay them out: random block tables and the
CPU backend's key/value split (the tree-attention tests and benchmarks build their caches here).
"""
from __future__ import annotations

import torch

__all__ = ["split_kv", "random_block_table"]


def split_kv(kv_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """key_cache, value_cache views of a layer cache, exactly as vLLM's CPU backend makes them."""
    nb, hkv, bs, d2 = kv_cache.shape
    return kv_cache.view(nb, hkv, 2 * bs, d2 // 2).chunk(2, dim=2)


def random_block_table(gen: torch.Generator, blocks_per_req: list[int], num_blocks: int,
                       width: int) -> torch.Tensor:
    """int32 [B, width]: disjoint shuffled physical blocks; unused columns point at random
    (possibly poisoned, possibly other requests') blocks, as stale vLLM tables may."""
    perm = torch.randperm(num_blocks, generator=gen)
    table = torch.randint(0, num_blocks, (len(blocks_per_req), width), generator=gen)
    start = 0
    for r, n in enumerate(blocks_per_req):
        table[r, :n] = perm[start:start + n]
        start += n
    assert start <= num_blocks
    return table.to(torch.int32)
