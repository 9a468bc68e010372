"""Move the accepted path's K/V to the slots a plain chain would have used (no vLLM import).

During verification node i of request r is written to the slot of logical position
``num_computed[r] + i`` (vLLM's contiguous slot mapping) with RoPE position
``num_computed[r] + depth(i)``. After acceptance the path (root, i_1, ..., i_a) with depth(i_j)
= j must sit at positions ``num_computed[r] + j``, as if decoded one token at a time. Its keys
already carry the right RoPE, so moving the raw cache contents is all that is left; vLLM's
rollback then forgets everything past the accepted length.

Ordering: i_j is strictly increasing and i_j >= j (every node comes after its ancestors, and a
depth-j node has j of them). ``compact_kv`` reads all sources before writing, which is always
safe. Applying the moves one by one in ascending j is safe too, which in-place GPU kernels rely
on: move j writes position j, and every later move k > j reads position i_k >= k > j, so no move
reads a position an earlier one wrote; and move j overwrites at most the source i_m of an earlier
move m < j (already read), never the source i_k >= k > j of a later one. Requests own disjoint
slots at these positions, so moves of different requests never interact.

Which node goes to which slot is `verify.slot_moves` (the one rule every path uses); this module
is the host's copy of the K/V over vLLM's CPU cache layouts.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from vllm_treespec.attention.cpu_kv_layout import check_layout, slot_element_offsets

__all__ = ["compact_kv"]


def compact_kv(kv_caches: Sequence[torch.Tensor] | torch.Tensor, src_slots: torch.Tensor,
               dst_slots: torch.Tensor, *, layout: str) -> None:
    """Copy K and V of every src slot to its dst slot, in place, in every layer.

    src_slots / dst_slots: int64 [M], the real moves (`slot_moves.listed_moves`); kv_caches:
    per-layer CPU caches ``[num_blocks, Hkv, block_size, 2 * D]`` (contiguous, as vLLM
    allocates them), or one stacked tensor ``[L, num_blocks, Hkv, block_size, 2 * D]`` (then
    all layers move in one op); layout: the layers' ISA (see cpu_kv_layout). Per layer
    this is one gather of all sources, then one scatter, so moves may alias each other.
    """
    if src_slots.numel() == 0:
        return
    stacked = isinstance(kv_caches, torch.Tensor)
    layers = [kv_caches] if stacked else list(kv_caches)
    ref = layers[0]
    _, hkv, bs, d2 = ref.shape[-4:]
    check_layout(layout, ref.dtype, bs, d2 // 2)
    src = slot_element_offsets(src_slots, layout, hkv, bs, d2 // 2).flatten()
    dst = slot_element_offsets(dst_slots, layout, hkv, bs, d2 // 2).flatten()
    for cache in layers:
        if not cache.is_contiguous() or cache.shape[-4:] != ref.shape[-4:]:
            raise ValueError("compact_kv needs contiguous caches of one shape")
        flat = cache.view(-1, cache[0].numel()) if stacked else cache.view(1, -1)
        src_d, dst_d = src.to(cache.device), dst.to(cache.device)
        flat.index_copy_(1, dst_d, flat.index_select(1, src_d))
