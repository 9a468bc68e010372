"""vLLM general-plugin entry point (`vllm.general_plugins` -> `vllm_treespec.plugin:register`).

vLLM calls `register()` in every process it starts (API server, engine core, workers), whether or
not this plugin is configured, so it stays nearly inert: no heavy imports and two patches that act only on what treespec
itself produces, each installed only where vLLM already imported the module it patches: the check
of a request's `treespec_*` extra arguments (engine/request_options.py; a bad value is a 400 in
the API server, which never constructs a TreeProposer), and the engine core's side of the draft
handoff (engine/draft_handoff.py), which acts only on step outputs a treespec worker marked.
The plugin becomes active only when a TreeProposer is constructed, i.e. when the engine was
configured with `--speculative-config '{"model": "vllm_treespec.TreeProposer", ...}'`; that is
when `activate()` checks the vLLM version and installs the runner patches.
"""
from __future__ import annotations

import logging
import sys

logger = logging.getLogger("vllm_treespec")


def register() -> None:
    if "vllm.sampling_params" in sys.modules:     # a process that builds requests (see there)
        from vllm_treespec.engine.request_options import install

        install()
    if "vllm.v1.executor.multiproc_executor" in sys.modules:    # a process that owns an executor
        from vllm_treespec.engine.draft_handoff import install as install_handoff

        install_handoff()
    logger.debug("vllm_treespec plugin registered (inert until a TreeProposer is configured)")


def activate() -> None:
    """Check the vLLM version and install the patches (idempotent per process)."""
    from vllm_treespec.engine import activate as _activate

    _activate()
