"""Startup checks that the served model can be verified with trees, with the reason if not."""
from __future__ import annotations

from typing import Any

__all__ = ["check_tree_attention"]


def check_tree_attention(model: Any) -> None:
    """Raise if some attention layer of `model` cannot apply a tree mask.

    Tree-shaped drafts need every layer to mask tree rows by their ancestors; a layer that
    cannot (another backend, sliding window, ALiBi, sinks, quantised KV) would compute those rows
    wrongly, so the deployment must use chains (tree.builder: chain) instead.
    """
    from vllm.model_executor.layers.attention import Attention

    from vllm_treespec.engine.tree_attention_backend import unsupported_reason

    for name, module in model.named_modules():
        if not isinstance(module, Attention):
            continue
        reason = unsupported_reason(module.impl, getattr(module, "kv_cache_dtype", "auto"))
        if reason is not None:
            raise RuntimeError(
                f"treespec: layer {name} cannot verify tree drafts ({reason}); set tree.builder: "
                "chain in the deployment config, or serve a model/backend without it")
