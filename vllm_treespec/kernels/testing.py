"""Test helpers for the kernels: which mode Triton runs in, random paged-KV cases (no Triton).

Without a GPU the kernels run in Triton's CPU interpreter, which triton 3.9 selects per
``@triton.jit`` decoration from ``TRITON_INTERPRET``; its own library kernels (``tl.sum``,
``tl.cdiv``, ...) are decorated when triton is first imported, and an interpreted kernel cannot
call compiled-mode ones. So the variable must be set before anything imports triton (vLLM does
on import): tests/conftest.py sets it for the session when there is no CUDA device.
"""
from __future__ import annotations

import os
import sys
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["interpreted", "triton_mode_problem", "PagedTreeCase", "paged_tree_case", "poison_"]


def interpreted() -> bool:
    """True when kernels must run in Triton's CPU interpreter (no CUDA device)."""
    return not torch.cuda.is_available()


def triton_mode_problem() -> str | None:
    """Why the kernels cannot run here (a skip message), or None when they can."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return "triton is not installed"
    if not interpreted():
        return None
    from triton import knobs

    if not knobs.runtime.interpret:
        return "no CUDA device and TRITON_INTERPRET is not 1 (tests/conftest.py sets it)"
    if "triton.language" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
        return "TRITON_INTERPRET changed after triton was imported"
    from triton.language import standard

    if type(standard.cdiv).__name__ != "InterpretedFunction":
        return ("triton was imported before TRITON_INTERPRET=1 was set, so its library "
                "kernels are not interpretable; set it before anything imports triton")
    return None


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
    from vllm_treespec.attention.testing import random_block_table
    from vllm_treespec.tree import DraftTree, TreeBatch
    from vllm_treespec.tree.testing import random_tree

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
