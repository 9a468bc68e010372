"""Startup checks that the served model can be verified with trees, with the reason if not."""
from __future__ import annotations

from typing import Any

__all__ = ["check_tree_attention", "unsupported_reason"]

# the cache in the model's dtype, which both tree kernels read it as
_PLAIN_KV = (None, "auto")


def unsupported_reason(impl: Any, kv_cache_dtype: str | None) -> str | None:
    """Why a layer's attention cannot be tree-masked (None = it can).

    Tree-aware impls (engine/tree_attention_backend.py on CPU, engine/tree_attention_triton.py
    on CUDA) set the class attribute ``tree_masks``; both recompute tree rows with their own
    kernels, which know the prefix + ancestor mask, an optional logits soft cap and GQA, and
    nothing else that changes which keys a row sees or how the cache is stored."""
    if not getattr(type(impl), "tree_masks", False):
        return (f"its attention backend is {type(impl).__name__}, not a treespec tree backend "
                "(CPU_ATTN on CPU, TRITON_ATTN on CUDA)")
    from vllm.v1.attention.backend import AttentionType

    if impl.attn_type != AttentionType.DECODER:
        return f"attention type {impl.attn_type} (tree masks apply to decoder self-attention)"
    if impl.sliding_window not in (-1, None, (-1, -1)):
        return "sliding-window attention"
    if getattr(impl, "chunk_lookback", -1) > -1:
        return "chunked local attention (chunk_lookback)"
    if impl.alibi_slopes is not None:
        return "ALiBi"
    if impl.sinks is not None:
        return "attention sinks"
    if kv_cache_dtype not in _PLAIN_KV:
        return (f"kv_cache_dtype={kv_cache_dtype} (the tree kernels read the cache in the model's "
                "dtype; serve with --kv-cache-dtype auto)")
    return None


def check_tree_attention(model: Any) -> None:
    """Raise if some attention layer of `model` cannot apply a tree mask.

    Tree-shaped drafts need every layer to mask tree rows by their ancestors; a layer that
    cannot (another backend, sliding window, ALiBi, sinks, quantised KV) would compute those rows
    wrongly, so the deployment must use chains (tree.builder: chain) instead.
    """
    from vllm.model_executor.layers.attention import Attention

    for name, module in model.named_modules():
        if not isinstance(module, Attention):
            continue
        reason = unsupported_reason(module.impl, getattr(module, "kv_cache_dtype", "auto"))
        if reason is not None:
            raise RuntimeError(
                f"treespec: layer {name} cannot verify tree drafts ({reason}); set tree.builder: "
                "chain in the deployment config, or serve a model/backend without it")
