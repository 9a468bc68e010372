"""The only package that touches vLLM internals: the proposer, the runner patches, metrics.

`activate()` runs once per process, when a TreeProposer is constructed (inside the model
runner's constructor, before the model and its attention layers are built): it checks the vLLM
version and installs the runner patches from the explicit registry in `runner_patches`.
`activate_tree_attention()` runs there too, for deployments that draft branching trees (any
tree.builder but chain): it registers the tree-aware attention backend, CPU_ATTN's replacement
on CPU, TRITON_ATTN's on CUDA (engine/tree_attention_triton.py; engine/backend_choice.py makes
tree deployments use it). A chain deployment keeps vLLM's backend untouched: its drafts need
no mask beyond the causal one, and the wrapper would cost a call per layer and step.
"""
from __future__ import annotations

import threading

_lock = threading.Lock()
_active = False


def activate() -> None:
    global _active
    with _lock:
        if _active:
            return
        from vllm.logger import init_logger

        from vllm_treespec.engine.runner_patches import REGISTRY
        from vllm_treespec.engine.version import check_vllm_version

        version = check_vllm_version()
        REGISTRY.install_all()
        from vllm_treespec.engine import draft_handoff, request_options

        request_options.install()
        draft_handoff.install()      # the in-process executor of offline use lives here
        _active = True
        init_logger(f"vllm.{__name__}").info("vllm_treespec active on vLLM %s: %d runner patches installed",
                    version, len(REGISTRY.patches))


_tree_attention = False


def activate_tree_attention() -> None:
    """Register the tree-aware attention backend of this platform for the layers built from
    now on (once per process)."""
    global _tree_attention
    with _lock:
        if _tree_attention:
            return
        from vllm.platforms import current_platform

        if current_platform.is_cpu():
            from vllm_treespec.engine import tree_attention_backend

            tree_attention_backend.register()
        elif current_platform.is_cuda():
            from vllm_treespec.engine import tree_attention_triton

            tree_attention_triton.register()
        _tree_attention = True
