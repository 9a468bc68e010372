"""Which accepted node's K/V goes to which slot: the one move rule of KV compaction (no vLLM).

During verification node i of request r sits at the slot of node row ``offsets[r] + i`` (the
step's slot mapping); after acceptance the path (root, i_1, ..., i_a), depth(i_j) = j, must sit
where a chain would have put it: node i_j moves to node j's slot, and i_j == j moves nothing
(a node-prefix path moves nothing at all). verify/kv_compaction.py explains why moving is all
that is left and why the order (request, then j ascending) is safe in place.

Every compaction calls this module: the host path (`verify.kv_compaction.compact_kv` over
`listed_moves`), the device path (`engine/device_verify.py`, then the Triton kernel
`kernels.kv_compaction.compact_kv` or its CUDA twin, which take the ``[B, W]`` pairs as they
are) and the statistics (`count_moves`). It runs where the accepted nodes are: numpy on the
host (a few tiny arrays per step, where torch's per-op cost dominated), torch on a device,
without a host sync there, so the device path queues it before anything is read back.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["node_moves", "slot_moves", "listed_moves", "count_moves"]

Nodes = torch.Tensor | np.ndarray


def _on_host(x: Any) -> bool:
    return not (isinstance(x, torch.Tensor) and x.device.type != "cpu")


def _int64(x: Any, host: bool, device: torch.device | None = None) -> Any:
    """x as int64: a numpy array on the host (a handful of tiny arrays per step, where torch's
    per-op cost is ten times numpy's), else a torch tensor on `device`."""
    if host:
        return np.asarray(x.cpu() if isinstance(x, torch.Tensor) else x, dtype=np.int64)
    return torch.as_tensor(x).to(device=device, dtype=torch.int64)


def _rule(nodes: Any) -> tuple[Any, Any]:
    """The rule itself, written once for numpy (host) and torch (device) int64 [B, W] arrays."""
    if isinstance(nodes, np.ndarray):
        xp, depth = np, np.arange(1, nodes.shape[1] + 1)
    else:
        xp, depth = torch, torch.arange(1, nodes.shape[1] + 1, device=nodes.device)
    move = (nodes >= 0) & (nodes != depth)
    return xp.where(move, nodes, -1), xp.where(move, depth, -1)


def _tensor(x: Any) -> torch.Tensor:
    return torch.from_numpy(x) if isinstance(x, np.ndarray) else x


def _nodes(accepted_nodes: Nodes) -> tuple[Any, bool, torch.device | None]:
    """(int64 [B, W] nodes, on the host?, device) of accepted_nodes, after checking the shape."""
    host = _on_host(accepted_nodes)
    dev = None if host else accepted_nodes.device
    nodes = _int64(accepted_nodes, host, dev)
    if nodes.ndim != 2:
        raise ValueError(f"accepted_nodes must be [B, W], got {tuple(nodes.shape)}")
    return nodes, host, dev


def node_moves(accepted_nodes: Nodes) -> tuple[torch.Tensor, torch.Tensor]:
    """(src_nodes, dst_nodes) int64 ``[B, W]`` local node indices: column j - 1 moves node i_j
    to node j; -1 where nothing moves (unused column, or i_j == j). On the nodes' device.

    accepted_nodes: int ``[B, W]`` local nodes of each accepted path without the root, -1 padded
    (``AcceptResult.accepted_nodes``; numpy or torch)."""
    src, dst = _rule(_nodes(accepted_nodes)[0])
    return _tensor(src), _tensor(dst)


def _check_nodes(offsets: np.ndarray, nodes: np.ndarray) -> None:
    """Every accepted node i_j of request r must satisfy j <= i_j < its tree's size (host only:
    on a device the check would wait for the walk)."""
    sizes = offsets[1:] - offsets[:-1]
    if sizes.size != nodes.shape[0]:
        raise ValueError(f"offsets describe {sizes.size} requests, accepted_nodes {nodes.shape[0]}")
    depth = np.arange(1, nodes.shape[1] + 1)
    if ((nodes >= 0) & ((nodes < depth) | (nodes >= sizes[:, None]))).any():
        raise ValueError("accepted node index out of range (need depth j <= i_j < tree size)")


def slot_moves(slot_mapping: torch.Tensor, offsets: torch.Tensor, accepted_nodes: Nodes
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """(src_slots, dst_slots) int64 ``[B, W]`` on accepted_nodes' device, -1 where nothing moves.

    slot_mapping: int ``[T]`` slot of every node row (node i of request r at row
    ``offsets[r] + i``); offsets: int ``[B+1]`` of the verified trees. Rows are in request order
    with j ascending, the order in-place copies need. Node indices are checked on the host."""
    nodes, host, dev = _nodes(accepted_nodes)
    offsets, slots = _int64(offsets, host, dev), _int64(slot_mapping, host, dev)
    if host:
        _check_nodes(offsets, nodes)
    src, dst = _slot_pairs(slots, offsets, nodes)
    return _tensor(src), _tensor(dst)


def _slot_pairs(slots: Any, offsets: Any, nodes: Any) -> tuple[Any, Any]:
    """`slot_moves` on int64 arrays of one kind, numpy (host) or torch (device)."""
    src, dst = _rule(nodes)
    where = np.where if isinstance(nodes, np.ndarray) else torch.where
    start, last = offsets[:-1][:, None], slots.shape[0] - 1

    def slot(local: Any) -> Any:
        return where(local >= 0, slots[(start + local.clip(min=0)).clip(max=last)], -1)

    return slot(src), slot(dst)


def listed_moves(src: torch.Tensor, dst: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The real moves of ``[B, W]`` pairs as flat ``[M]`` lists, request order, j ascending (the
    host's `verify.kv_compaction.compact_kv` takes these)."""
    if _on_host(src):
        s, d = src.numpy(), dst.numpy()
        move = s >= 0
        return torch.from_numpy(s[move]), torch.from_numpy(d[move])
    move = src >= 0
    return src[move], dst[move]


def count_moves(accepted_nodes: Nodes) -> int:
    """Number of slots a compaction of these accepted paths moves (a host sync on a device)."""
    return int((_rule(_nodes(accepted_nodes)[0])[0] >= 0).sum())
