"""Where a token's K and V live inside vLLM 0.32.0's CPU paged KV cache (no vLLM import).

A CPU layer cache is ``kv_cache [num_blocks, Hkv, block_size, 2 * D]``; vLLM splits it with
``kv_cache.view(num_blocks, Hkv, 2 * block_size, D).chunk(2, dim=2)``, so for each (block, head)
the first ``block_size * D`` elements hold K and the next ``block_size * D`` hold V. The shape
``[block_size, D]`` of those views is only nominal: ``cpu_attn_reshape_and_cache`` packs each
half in an ISA-specific order (read from vLLM's csrc/cpu/cpu_attn_{vec,amx}.hpp and checked
against the op itself in tests/test_tree_attention_cpu.py):

- ``vec`` / ``vec16``: K column-major ``[D, block_size]``, V row-major ``[block_size, D]``;
- ``amx`` (bf16): K in 16-token groups of 2-element pairs ``[bs/16, D/2, 16, 2]``, V in
  16-wide head groups of 2-token pairs ``[D/16, bs/2, 16, 2]``;
- ``token_major``: both ``[block_size, D]`` (the nominal shape; handy for tests and for
  backends that store plain rows).

A layout is the shape of one half's elements plus which of those axes spell the token offset and
which spell the head-dim index (major to minor). Both the block gather (attention) and the
per-slot element offsets (KV compaction, tests) are derived from that one description.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["LAYOUTS", "HalfLayout", "check_layout", "half_layouts", "slot_element_offsets",
           "gather_blocks"]


@dataclass(frozen=True)
class HalfLayout:
    """Element order of K (or V) of one (block, head): ``shape(bs, D)`` in memory order."""
    shape: Callable[[int, int], tuple[int, ...]]
    token_axes: tuple[int, ...]
    dim_axes: tuple[int, ...]


_ROW = HalfLayout(lambda bs, d: (bs, d), (0,), (1,))
_COL = HalfLayout(lambda bs, d: (d, bs), (1,), (0,))
_AMX_K = HalfLayout(lambda bs, d: (bs // 16, d // 2, 16, 2), (0, 2), (1, 3))
_AMX_V = HalfLayout(lambda bs, d: (d // 16, bs // 2, 16, 2), (1, 3), (0, 2))

_LAYOUTS: dict[str, tuple[HalfLayout, HalfLayout]] = {
    "token_major": (_ROW, _ROW),
    "vec": (_COL, _ROW),
    "vec16": (_COL, _ROW),
    "amx": (_AMX_K, _AMX_V),
}
LAYOUTS = tuple(_LAYOUTS)


def check_layout(layout: str, dtype: torch.dtype, block_size: int, head_size: int) -> None:
    """Fail early (instead of reading garbage) on layouts this module cannot describe."""
    if layout not in _LAYOUTS:
        raise NotImplementedError(
            f"KV cache layout {layout!r} is not supported by the tree path; supported: "
            f"{', '.join(LAYOUTS)} (pass the attention layer's `isa`)")
    if dtype not in (torch.float32, torch.float16, torch.bfloat16, torch.float64):
        raise NotImplementedError(f"KV cache dtype {dtype} is not supported (fp8 caches are not)")
    if layout == "amx" and (dtype.itemsize != 2 or block_size % 32 or head_size % 32):
        raise ValueError("layout 'amx' needs a 2-byte dtype, block_size and head_size % 32 == 0")


def half_layouts(layout: str) -> tuple[HalfLayout, HalfLayout]:
    """(K, V) element orders of `layout`."""
    return _LAYOUTS[layout]


@functools.lru_cache(maxsize=64)
def _inner_offsets(half: HalfLayout, block_size: int, head_size: int) -> torch.Tensor:
    """int64 [block_size, D]: element offset of (token offset, dim) inside one half.

    Cached (KV compaction asks every step for the same few geometries); callers must not
    modify the returned tensor."""
    shape = half.shape(block_size, head_size)
    strides = [1] * len(shape)
    for a in range(len(shape) - 2, -1, -1):
        strides[a] = strides[a + 1] * shape[a + 1]

    def split(values: torch.Tensor, axes: tuple[int, ...]) -> torch.Tensor:
        out = torch.zeros_like(values)
        for a in reversed(axes):               # minor axis first
            out += (values % shape[a]) * strides[a]
            values = values // shape[a]
        return out

    tok = split(torch.arange(block_size), half.token_axes)
    dim = split(torch.arange(head_size), half.dim_axes)
    return tok[:, None] + dim[None, :]


def slot_element_offsets(slots: torch.Tensor, layout: str, num_kv_heads: int, block_size: int,
                         head_size: int) -> torch.Tensor:
    """int64 [M, Hkv, 2, D]: flat element index, in a contiguous layer cache
    ``[num_blocks, Hkv, block_size, 2 * D]``, of K (index 0) and V (index 1) of each slot.

    Compaction moves slots with one gather and one scatter over these indices per layer.
    """
    k_half, v_half = half_layouts(layout)
    inner = torch.stack([_inner_offsets(k_half, block_size, head_size),
                         _inner_offsets(v_half, block_size, head_size) + block_size * head_size])
    slots = slots.to(torch.int64).cpu()
    half = block_size * head_size
    block, off = slots // block_size, slots % block_size
    head = torch.arange(num_kv_heads, dtype=torch.int64)
    base = (block[:, None] * num_kv_heads + head[None, :]) * (2 * half)    # [M, Hkv]
    return base[:, :, None, None] + inner[:, off].permute(1, 0, 2)[:, None]  # [M, Hkv, 2, D]


def gather_blocks(cache: torch.Tensor, block_ids: torch.Tensor, half: HalfLayout,
                  out: torch.Tensor | None = None) -> torch.Tensor:
    """Gather whole blocks of one half and unpack them to token-major rows in one indexing op.

    cache: ``key_cache`` or ``value_cache`` view ``[num_blocks, Hkv, block_size, D]`` as vLLM
    builds it; block_ids: int64 [R, nblk] physical block ids; out: optional buffer with at
    least the result's numel and the cache dtype (reused to avoid page-faulting fresh memory).
    Returns a contiguous head-major ``[Hkv, R, nblk * block_size, D]`` tensor whose token axis
    is the logical position ``j * block_size + offset`` for block column j.
    """
    _, hkv, bs, d = cache.shape
    shape = half.shape(bs, d)
    axes = half.token_axes + half.dim_axes
    # [Hkv, num_blocks, *token axes, *dim axes]: a strided view, nothing moves yet. Indexing its
    # block axis writes [Hkv, R, nblk, *token axes, *dim axes] contiguously, i.e. already
    # [Hkv, R, L, D] token-major: gather and unpack are one pass.
    src = cache.flatten(2).unflatten(2, shape).permute(1, 0, *(2 + a for a in axes))
    r, nblk = block_ids.shape
    full = (hkv, r, nblk, *(shape[a] for a in axes))
    if out is None:
        out = torch.empty(full, dtype=cache.dtype)
    else:
        out = out.flatten()[:hkv * r * nblk * bs * d].view(full)
    torch.ops.aten.index.Tensor_out(src, [None, block_ids], out=out)
    return out.view(hkv, r, nblk * bs, d)
