"""Move accepted tree nodes' K/V to their chain slots, every layer in one launch (Triton).

After acceptance node i_j (depth j) of request r must sit at the slot of position
``num_computed + j`` (see ``verify.kv_compaction``). Per request the moves come as padded rows
``src_slots[r, :]`` / ``dst_slots[r, :]`` in ascending j, -1 for no move; pairs with src == dst
are skipped. ``verify.slot_moves.slot_moves`` (the one move rule) builds them on the device from
the step's slot mapping.

Layers: a ``KVLayers`` table of data pointers (built once; vLLM never moves its caches), one per
K or V tensor of every layer, all ``[num_blocks, block_size, Hkv, D]`` with the same strides and
dtype. The copy is dtype-blind: elements are moved as 8-, 4-, 2- or 1-byte words, whichever
divides the rows, strides and base addresses, so fp8 caches work as well.

Aliasing: move j may overwrite the source of an earlier move m < j of the same request
(i_m == j), never a source of a later one (i_k >= k > j). A program owns one request, one
tensor and a range of element columns, and handles the request's moves in chunks in ascending
j: it loads all sources of a chunk, waits at a barrier, then stores. Within a chunk every read
precedes every write; a chunk's stores can only hit sources of the same or earlier chunks
(already read); sources of later chunks are positions never written by earlier ones. Requests
own disjoint slots and columns are independent, so programs never interact.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

__all__ = ["KVLayers", "compact_kv"]

_WORD = {8: tl.int64, 4: tl.int32, 2: tl.int16, 1: tl.int8}


@triton.jit
def _compact_kernel(ptrs, src, dst, width, stride_move, stride_blk, stride_tok, stride_head,
                    row_words, n_cols, BLOCK_SIZE: tl.constexpr, WORD: tl.constexpr,
                    BLOCK_J: tl.constexpr, BLOCK_C: tl.constexpr):
    r = tl.program_id(0).to(tl.int64)
    base = tl.load(ptrs + tl.program_id(1)).to(tl.pointer_type(WORD))
    c = tl.program_id(2) * BLOCK_C + tl.arange(0, BLOCK_C)
    c_ok = c < n_cols
    col = (c // row_words).to(tl.int64) * stride_head + c % row_words
    for j0 in range(0, width, BLOCK_J):
        j = j0 + tl.arange(0, BLOCK_J)
        j_ok = j < width
        s = tl.load(src + r * stride_move + j, mask=j_ok, other=-1).to(tl.int64)
        d = tl.load(dst + r * stride_move + j, mask=j_ok, other=-1).to(tl.int64)
        mv = (s >= 0) & (d >= 0) & (s != d)
        s_row = (s // BLOCK_SIZE) * stride_blk + (s % BLOCK_SIZE) * stride_tok
        d_row = (d // BLOCK_SIZE) * stride_blk + (d % BLOCK_SIZE) * stride_tok
        m2 = mv[:, None] & c_ok[None, :]
        x = tl.load(base + s_row[:, None] + col[None, :], mask=m2)
        tl.debug_barrier()          # every read of this chunk before any of its writes
        tl.store(base + d_row[:, None] + col[None, :], x, mask=m2)


@dataclass(frozen=True)
class KVLayers:
    """Device table of cache base pointers plus the geometry (bytes) shared by its tensors."""
    ptrs: torch.Tensor                  # int64 [num_tensors] on the caches' device
    block_size: int
    num_heads: int
    row_bytes: int                      # head_dim * element size, contiguous
    strides: tuple[int, int, int]       # block, token, head strides in bytes
    base_align: int                     # largest power of two dividing every base address
    tensors: tuple[torch.Tensor, ...]   # kept alive while the table is in use

    @classmethod
    def from_caches(cls, caches: Sequence[torch.Tensor]) -> "KVLayers":
        """caches: per layer either vLLM's FlashAttention ``kv_cache [2, num_blocks,
        block_size, Hkv, D]`` (split into K and V) or separate ``[num_blocks, block_size, Hkv,
        D]`` tensors. All must share shape, strides, dtype and device."""
        views: list[torch.Tensor] = []
        for c in caches:
            views.extend(c.unbind(0) if c.dim() == 5 else [c])
        if not views:
            raise ValueError("no caches given")
        ref = views[0]
        if ref.dim() != 4 or ref.stride(3) != 1:
            raise ValueError("caches must be [num_blocks, block_size, Hkv, D] with a contiguous "
                             "head dim")
        for v in views:
            if (v.shape != ref.shape or v.stride() != ref.stride() or v.dtype != ref.dtype
                    or v.device != ref.device):
                raise ValueError("all caches must share shape, strides, dtype and device")
        item = ref.element_size()
        align = 256
        for v in views:
            while v.data_ptr() % align:
                align //= 2
        ptrs = torch.tensor([v.data_ptr() for v in views], dtype=torch.int64, device=ref.device)
        return cls(ptrs, ref.shape[1], ref.shape[2], ref.shape[3] * item,
                   tuple(s * item for s in ref.stride()[:3]), align, tuple(views))

    def word_bytes(self, limit: int) -> int:
        """Largest copy unit <= limit (a power of two) dividing rows, strides and bases."""
        w = limit
        while w > 1 and any(x % w for x in (self.row_bytes, *self.strides, self.base_align)):
            w //= 2
        return w

    @property
    def geometry(self) -> list[int]:
        """The CUDA op's geometry argument (csrc/cuda/launchers.h KVGeometry)."""
        return [self.block_size, *self.strides, self.num_heads, self.row_bytes, self.base_align]


def compact_kv(layers: KVLayers, src_slots: torch.Tensor, dst_slots: torch.Tensor, *,
               block_j: int | None = None) -> None:
    """Copy slot src -> slot dst in every tensor of ``layers``, in place, one launch.

    src_slots / dst_slots: int ``[B, W]`` per request in ascending destination order (see the
    module docstring for why that order makes in-place copying safe), -1 for no move.
    """
    if src_slots.shape != dst_slots.shape or src_slots.dim() != 2:
        raise ValueError("src_slots and dst_slots must both be [B, W]")
    b, w = src_slots.shape
    if b == 0 or w == 0:
        return
    src = src_slots.contiguous()
    dst = dst_slots.contiguous()
    word = layers.word_bytes(8)
    row_words = layers.row_bytes // word
    n_cols = layers.num_heads * row_words
    block_j = block_j or min(16, triton.next_power_of_2(w))
    block_c = min(triton.next_power_of_2(n_cols), max(64, 4096 // block_j))
    grid = (b, layers.ptrs.numel(), triton.cdiv(n_cols, block_c))
    _compact_kernel[grid](layers.ptrs, src, dst, w, src.stride(0),
                          *(x // word for x in layers.strides), row_words, n_cols,
                          BLOCK_SIZE=layers.block_size, WORD=_WORD[word], BLOCK_J=block_j,
                          BLOCK_C=block_c)
