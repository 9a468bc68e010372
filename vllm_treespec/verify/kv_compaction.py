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
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from vllm_treespec.attention.cpu_kv_layout import check_layout, slot_element_offsets

__all__ = ["accepted_local_moves", "accepted_slot_moves", "compact_kv"]


def accepted_local_moves(offsets: torch.Tensor, accepted_nodes: torch.Tensor
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(request, source node i_j, destination index j), int64 [M] each, of every move: request
    order, j ascending, moves with i_j == j dropped (a node-prefix path yields none).

    offsets: int [B+1] of the verified tree batch (to check node indices); accepted_nodes:
    int [B, W] local node indices of the accepted path without the root, -1 padded
    (``AcceptResult.accepted_nodes``). Slots are the caller's: positions num_computed + i in a
    block table (accepted_slot_moves) or the step's slot mapping of each node row (engine).
    """
    # numpy: a handful of tiny arrays per step, where torch's per-op overhead dominated
    nodes = np.asarray(torch.as_tensor(accepted_nodes, dtype=torch.int64).cpu())
    if nodes.ndim != 2:
        raise ValueError(f"accepted_nodes must be [B, W], got {tuple(nodes.shape)}")
    b, w = nodes.shape
    offsets = np.asarray(torch.as_tensor(offsets, dtype=torch.int64).cpu())
    sizes = offsets[1:] - offsets[:-1]
    if sizes.size != b:
        raise ValueError(f"offsets describe {sizes.size} requests, accepted_nodes {b}")
    taken = nodes >= 0
    depth = np.arange(1, w + 1, dtype=np.int64)
    if (taken & ((nodes < depth) | (nodes >= sizes[:, None]))).any():
        raise ValueError("accepted node index out of range (need depth j <= i_j < tree size)")
    req, col = np.nonzero(taken & (nodes != depth))          # row-major: request order, j ascending
    return torch.from_numpy(req), torch.from_numpy(nodes[req, col]), torch.from_numpy(col + 1)


def accepted_slot_moves(offsets: torch.Tensor, accepted_nodes: torch.Tensor,
                        num_computed: torch.Tensor, block_table: torch.Tensor,
                        block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(src_slots, dst_slots), int64 [M]: every move of every request, request order, j ascending.

    offsets: int [B+1] of the verified tree batch (only to check node indices);
    accepted_nodes: int [B, W], local node indices of the accepted path without the root,
    -1 padded (``AcceptResult.accepted_nodes``); num_computed: int [B] (the root's position);
    block_table: [B, max_blocks] logical -> physical block. Moves with src == dst are dropped,
    so a path that is the node prefix 1..a yields none.
    """
    req, src, dst = accepted_local_moves(offsets, accepted_nodes)
    base = torch.as_tensor(num_computed, dtype=torch.int64).cpu()[req]
    src_pos, dst_pos = base + src, base + dst
    table = torch.as_tensor(block_table).cpu().to(torch.int64)

    def slot(pos: torch.Tensor) -> torch.Tensor:
        return table[req, pos // block_size] * block_size + pos % block_size

    return slot(src_pos), slot(dst_pos)


def compact_kv(kv_caches: Sequence[torch.Tensor] | torch.Tensor, src_slots: torch.Tensor,
               dst_slots: torch.Tensor, *, layout: str) -> None:
    """Copy K and V of every src slot to its dst slot, in place, in every layer.

    kv_caches: per-layer CPU caches ``[num_blocks, Hkv, block_size, 2 * D]`` (contiguous, as
    vLLM allocates them), or one stacked tensor ``[L, num_blocks, Hkv, block_size, 2 * D]``
    (then all layers move in one op); layout: the layers' ISA (see cpu_kv_layout). Per layer
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
