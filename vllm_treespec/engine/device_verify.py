"""KV compaction on the device (CUDA), with the Triton kernel, and the device-path switch.

On CUDA the target's logits, the KV caches and the step's slot mapping live on the GPU, so the
greedy walk runs there (verify/greedy.py: one argmax over the node rows, then
`kernels.tree_accept.greedy_tree_accept`; no host sync) and so does the accepted path's K/V
move: `verify.slot_moves.slot_moves` (the move rule every path uses) builds the slot pairs from
the slot mapping on the device and `kernels.kv_compaction.compact_kv` moves them in every layer
in one launch per cache geometry, over a pointer table (`KVLayers`) built once: vLLM never moves
its caches. Both are queued before anything is read back; then only the accepted tokens (vLLM
copies its sampler output to the host) and the accepted node indices ``[R, W]`` (the proposer's
statistics and the drafters that read the accepted path) cross to the host.
Sampled acceptance (verify/accept.py) stays a torch walk on the logits' device, with a host
sync per tree level; its accepted nodes are compacted here the same way.
The CPU path (engine/tree_verifier.py `compact`: index_copy over the CPU layouts) moves the same
slots.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DeviceKV", "cache_token", "compact_on_device", "wanted"]


def wanted(t: torch.Tensor) -> bool:
    """Whether the device kernels serve tensors on t's device (CUDA only; the tests force it)."""
    return t.is_cuda


def _kv_views(cache: torch.Tensor) -> list[torch.Tensor]:
    """K and V views ``[num_blocks, block_size, Hkv, D]`` of one layer's cache: TRITON_ATTN's
    logical ``[num_blocks, Hkv, block_size, 2 * D]`` or FLASH_ATTN's ``[2, num_blocks,
    block_size, Hkv, D]``."""
    if cache.dim() == 5:
        return list(cache.unbind(0))
    if cache.dim() == 4:
        return list(cache.transpose(1, 2).split(cache.shape[-1] // 2, dim=-1))
    raise ValueError(f"KV compaction: unexpected KV cache shape {tuple(cache.shape)}")


@dataclass(frozen=True)
class DeviceKV:
    """Every layer's K/V views as pointer tables, one per (shape, strides, dtype) geometry."""
    groups: tuple[Any, ...]      # kernels.kv_compaction.KVLayers
    token: tuple[int, ...]       # identity of the caches it was built from (see `matches`)

    @classmethod
    def from_caches(cls, caches: Sequence[torch.Tensor], token: tuple[int, ...] | None = None
                    ) -> "DeviceKV":
        """caches: each layer's bound KV cache once; token: what `runner_state.device_kv`
        compares to decide whether the runner's caches are still these (default: caches')."""
        from vllm_treespec.kernels.kv_compaction import KVLayers

        by_geometry: dict[tuple, list[torch.Tensor]] = {}
        for cache in caches:
            for v in _kv_views(cache):
                by_geometry.setdefault((tuple(v.shape), v.stride(), v.dtype, v.device), []).append(v)
        if not by_geometry:
            raise RuntimeError("KV compaction: the runner has no KV caches")
        return cls(tuple(KVLayers.from_caches(v) for v in by_geometry.values()),
                   cache_token(caches) if token is None else token)


def cache_token(caches: Sequence[torch.Tensor]) -> tuple[int, ...]:
    """Cheap identity of a cache list: its length and first and last base addresses."""
    if not caches:
        return (0,)
    return (len(caches), caches[0].data_ptr(), caches[-1].data_ptr())


def compact_on_device(kv: DeviceKV, slot_mapping: torch.Tensor, offsets: torch.Tensor,
                      accepted_nodes: torch.Tensor) -> None:
    """Move every tree's accepted node i_j to the slot of node j, in every layer, in place.

    slot_mapping: int [T] slot of every tree node row (TreeStep.slot_mapping, on the caches'
    device); offsets: int64 [R+1] the step's tree offsets (host or device); accepted_nodes: int [R, W]
    local accepted nodes without the root, -1 padded, on the device. No host sync."""
    from vllm_treespec.kernels.kv_compaction import compact_kv
    from vllm_treespec.verify.slot_moves import slot_moves

    src, dst = slot_moves(slot_mapping, offsets, accepted_nodes)
    for layers in kv.groups:
        compact_kv(layers, src, dst)
