"""Python side of the CUDA kernels in csrc/cuda/ (``vllm_treespec._C_cuda``, opt-in build).

The extension exists only when built with ``TREESPEC_BUILD_CUDA=1`` against a CUDA torch;
``available()`` says whether its ops are registered. Same contracts as the Triton wrappers
(``tree_accept.greedy_tree_accept``, ``kv_compaction.compact_kv``), so callers can switch.
"""
from __future__ import annotations

import importlib

import torch

from vllm_treespec.kernels.kv_compaction import KVLayers

__all__ = ["available", "greedy_tree_accept", "compact_kv"]


def available() -> bool:
    """True when ``vllm_treespec._C_cuda`` imports (and so its torch ops are registered)."""
    try:
        importlib.import_module("vllm_treespec._C_cuda")
    except ImportError:
        return False
    return hasattr(torch.ops.treespec_cuda, "greedy_tree_accept")


def greedy_tree_accept(offsets: torch.Tensor, tokens: torch.Tensor, parents: torch.Tensor,
                       target_tokens: torch.Tensor, width: int
                       ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(emitted [B, width], accepted_nodes [B, width], num_emitted [B]), int64, -1 padded."""
    as64 = lambda x: x.to(torch.int64).contiguous()  # noqa: E731
    return torch.ops.treespec_cuda.greedy_tree_accept(
        as64(offsets), as64(tokens), as64(parents), as64(target_tokens), int(width))


def compact_kv(layers: KVLayers, src_slots: torch.Tensor, dst_slots: torch.Tensor) -> None:
    """Copy slot src -> dst in every tensor of ``layers`` (``[B, W]`` pairs, -1 = no move)."""
    torch.ops.treespec_cuda.kv_compact(layers.ptrs, src_slots.to(torch.int64).contiguous(),
                                       dst_slots.to(torch.int64).contiguous(), layers.geometry)
