"""Engine-agnostic tree core: draft trees, their batched form, candidates, builders, scorers and
the template bandit. Nothing here imports vLLM (docs/design.md sections 1-2).

Per request and step: a drafter produces candidates (a `DepthTable` or an `Expander`), a builder
turns them into a `DraftTree` within a node budget, and `TreeBatch.from_trees` lays all requests'
trees out as flat tensors for verification (format in `vllm_treespec.tree.batch`).

Example:
    >>> import numpy as np
    >>> from vllm_treespec.tree import DepthTable, TreeBatch, build_tree
    >>> table = DepthTable(tokens=[[4, 9], [2, 7]], logprobs=np.log([[.6, .3], [.8, .1]]), root=1)
    >>> tree = build_tree("best_first", table, budget=3)
    >>> tree.draft_token_ids(), tree.parents.tolist()
    ([4, 2, 9], [-1, 0, 1, 0])
    >>> TreeBatch.from_trees([tree, tree.prefix(1)]).offsets.tolist()
    [0, 4, 6]

An autoregressive drafter that expands many requests' trees level by level runs the builders in
lockstep instead (`builder_steps` + `run_lockstep`, `vllm_treespec.tree.lockstep`): one batched
expansion per round over all requests, the same trees as `build_tree` with an `Expander`.

`TreeBatch` (and torch) load on first use, so building trees does not import torch.
"""
from __future__ import annotations

from typing import Any

from vllm_treespec.tree.bandit import MAMBA_TEMPLATES, TemplateBandit, reward
from vllm_treespec.tree.builders import (BUILDERS, BuildError, build_beam, build_best_first,
                                         build_chain, build_static, build_threshold, build_tree,
                                         builder_params)
from vllm_treespec.tree.candidates import (CandidateError, DepthTable, Expander, NgramSignal,
                                           as_ngram_signal, clean_children)
from vllm_treespec.tree.draft_tree import DraftTree, TreeValidationError
from vllm_treespec.tree.lockstep import ExpandRequest, builder_steps, run_lockstep
from vllm_treespec.tree.ngram_table import NgramTable
from vllm_treespec.tree.scorers import (SCORERS, AccumLogProb, DartCombine, LinearScorer,
                                        PrestoEntropy, PrestoFixed, make_scorer)

__all__ = [
    "DraftTree", "TreeValidationError", "TreeBatch",
    "DepthTable", "Expander", "NgramSignal", "as_ngram_signal", "CandidateError", "NgramTable",
    "clean_children", "builder_steps", "run_lockstep", "ExpandRequest",
    "BUILDERS", "BuildError", "build_tree", "builder_params", "build_beam", "build_best_first",
    "build_chain", "build_static", "build_threshold",
    "SCORERS", "make_scorer", "LinearScorer", "AccumLogProb", "DartCombine", "PrestoFixed",
    "PrestoEntropy",
    "TemplateBandit", "reward", "MAMBA_TEMPLATES",
]


def __getattr__(name: str) -> Any:
    if name == "TreeBatch":  # imports torch
        from vllm_treespec.tree.batch import TreeBatch

        return TreeBatch
    raise AttributeError(f"module 'vllm_treespec.tree' has no attribute {name!r}")
