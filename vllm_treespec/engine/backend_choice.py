"""Which attention backend a tree deployment runs on (CUDA: TRITON_ATTN, chosen here).

vLLM 0.32 resolves a layer's backend when the model is built (`vllm.v1.attention.selector.
get_attn_backend`, reading `attention_config.backend`, then `backend_per_kind`), and picks
FLASH_ATTN first on CUDA when neither is set. Only TRITON_ATTN has a tree-aware replacement on
CUDA (engine/tree_attention_triton.py), so when the operator chose nothing, trees select it by
setting the worker's `attention_config.backend`: TreeProposer's constructor runs inside the
model runner's, before the model is built, on the very config object the layers read (vLLM's
Gemma4 config sets the same field the same way). An explicit other choice is refused, naming
the flag; nothing is silently overridden. CPU hosts have one backend (CPU_ATTN): nothing to do.
"""
from __future__ import annotations

import logging
from typing import Any

__all__ = ["select_tree_backend"]

logger = logging.getLogger("vllm_treespec")

FIX = ("serve with --attention-backend TRITON_ATTN (or leave it unset: trees then select it), "
       "or set tree.builder: chain in the treespec config")


def select_tree_backend(vllm_config: Any, is_cuda: bool | None = None) -> str | None:
    """Make a branching-tree deployment build its attention layers on TRITON_ATTN (CUDA).

    Returns the backend name selected here ("TRITON_ATTN"), None when nothing changed; raises
    RuntimeError when the operator chose a backend without tree masks. is_cuda: the platform
    (default: vLLM's current platform)."""
    if is_cuda is None:
        from vllm.platforms import current_platform

        is_cuda = current_platform.is_cuda()
    if not is_cuda:
        return None
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    rswa = getattr(getattr(vllm_config, "model_config", None), "rswa_window", None)
    if rswa is not None:
        raise RuntimeError(
            f"treespec: the model restricts attention to a sliding window (R-SWA, window {rswa}), "
            "which the tree kernel does not apply; set tree.builder: chain in the treespec config")
    triton = AttentionBackendEnum.TRITON_ATTN
    config = vllm_config.attention_config
    chosen = config.backend
    if chosen is not None and chosen != triton:
        raise RuntimeError(
            f"treespec: tree drafts need the TRITON_ATTN attention backend on CUDA, but "
            f"attention backend {chosen.name} was chosen; {FIX}")
    per_kind = {kind: b for kind, b in (config.backend_per_kind or {}).items()
                if b is not None and b != triton}
    if per_kind:
        named = ", ".join(f"{kind}: {b.name}" for kind, b in sorted(per_kind.items()))
        raise RuntimeError(
            f"treespec: tree drafts need the TRITON_ATTN attention backend on CUDA, but "
            f"attention_config.backend_per_kind chooses {named}; {FIX}")
    if chosen is None:
        config.backend = triton
        logger.info("treespec: tree drafts on CUDA: attention backend TRITON_ATTN selected "
                    "(no --attention-backend was given)")
        return triton.name
    return None
