"""Reads of the V1 model runner's state that the tree patches need (vLLM 0.32.0 attribute names).

Kept in one place so that a vLLM upgrade has one file to check besides the patch signatures.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["device_kv", "discarded_rows", "kv_caches_and_layout", "layer_kv_caches", "request_sampling",
           "step_slot_mapping"]


def discarded_rows(runner: Any, num_reqs: int) -> np.ndarray:
    """bool [num_reqs]: requests whose sampled token vLLM discards this step (partial prefills)."""
    mask = getattr(runner, "discard_request_mask", None)
    if mask is None:
        return np.zeros(num_reqs, dtype=bool)
    return np.asarray(mask.np[:num_reqs], dtype=bool)


def request_sampling(runner: Any, req_ids: Sequence[str]) -> list[Any]:
    """SamplingParams of each request. Its generator (`CachedRequestState.generator`) is not
    read: it is vLLM's sampler's, which may advance it in the same step; tree acceptance keeps
    its own (engine/tree_verifier.acceptance_generators)."""
    return [runner.requests[r].sampling_params for r in req_ids]


def step_slot_mapping(runner: Any, rows: torch.Tensor) -> torch.Tensor:
    """KV slot of each given flat token row of this step (single KV cache group): on CUDA it
    stays on the device (compaction runs there: engine/device_verify.py), else on the host."""
    from vllm_treespec.engine import device_verify

    slots = runner.input_batch.block_table[0].slot_mapping.gpu
    picked = slots[rows.to(slots.device)]
    if device_verify.wanted(slots):
        return picked.to(torch.int64)
    return picked.to("cpu", torch.int64)


def _bound_caches(runner: Any) -> list[tuple[torch.Tensor, Any]]:
    """(KV cache view, its attention layer) of every layer, each cache once."""
    out: list[tuple[torch.Tensor, Any]] = []
    seen: set[int] = set()
    for ctx in runner.compilation_config.static_forward_context.values():
        kv = getattr(ctx, "kv_cache", None)
        if not isinstance(kv, torch.Tensor) or kv.numel() == 0 or kv.data_ptr() in seen:
            continue
        seen.add(kv.data_ptr())
        out.append((kv, ctx))
    return out


def layer_kv_caches(runner: Any) -> list[torch.Tensor]:
    """Every attention layer's bound KV cache view (each once), as the attention ops see it."""
    return [kv for kv, _ in _bound_caches(runner)]


def device_kv(runner: Any, cached: Any = None) -> Any:
    """The runner's caches as device pointer tables (engine/device_verify.DeviceKV): `cached`
    while the runner still holds the caches it was built from (`runner.kv_caches`, the list
    vLLM binds once), else built anew from every layer's view."""
    from vllm_treespec.engine.device_verify import DeviceKV, cache_token

    token = cache_token(getattr(runner, "kv_caches", None) or [])
    if cached is not None and cached.token == token:
        return cached
    return DeviceKV.from_caches(layer_kv_caches(runner), token)


def kv_caches_and_layout(runner: Any) -> tuple[list[torch.Tensor], str]:
    """Every attention layer's KV cache tensor (each once) and their common CPU layout (ISA)."""
    bound = _bound_caches(runner)
    layouts = {getattr(ctx, "isa", "token_major") for _, ctx in bound}
    if len(layouts) != 1:
        raise RuntimeError(f"KV compaction needs one KV cache layout across layers, found {sorted(layouts)}")
    return [kv for kv, _ in bound], layouts.pop()
