"""Tree acceptance of one engine step: the rule each request needs, decided in one call.

The engine lays the step's trees out (engine/tree_verifier.py) and calls `accept_trees` once;
compaction then moves what the result accepted (slot_moves.py). Nothing here reaches back into
the engine (no vLLM import):
- every request greedy: the greedy walk (greedy.py; C++ on the host, Triton on CUDA);
- otherwise one sampled walk (accept.py): nodes with a drafter q row (sampled drafts) by
  recursive rejection sampling without replacement, every other node by the target-only rule;
  greedy requests among them still take the greedy walk.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from vllm_treespec.tree.batch import TreeBatch
from vllm_treespec.verify.accept import accept_rrs, accept_target_only
from vllm_treespec.verify.greedy import greedy_walk
from vllm_treespec.verify.result import AcceptResult
from vllm_treespec.verify.sampling_params import SAMPLING_EPS, SamplingParamsBatch

__all__ = ["accept_trees"]


def accept_trees(batch: TreeBatch, logits: torch.Tensor, params: Sequence[Any],
                 generators: Sequence[torch.Generator | None], width: int, *,
                 logit_rows: torch.Tensor | np.ndarray | None = None,
                 q_probs: torch.Tensor | None = None,
                 q_rows: np.ndarray | torch.Tensor | None = None,
                 coin_rows: int | None = None) -> AcceptResult:
    """Accepted paths and emitted tokens of a flat tree batch, ``width`` columns.

    batch: the step's trees (tree/batch.py), on the host or the logits' device; logits:
    [T, V] at every node row, or [R, V] with `logit_rows` [T] naming node i's row (the greedy
    walk then reads only the rows it visits; the sampled rules gather them); params: one per
    request with temperature / top_k / top_p / min_p (vLLM's SamplingParams); generators: one
    per request (None: torch's default stream);
    q_probs / q_rows: the drafter's q rows in compact form (q_rows[u] = u's row, -1 = none);
    coin_rows: fixed coin block per seeded request (coins.py).
    """
    if all(float(p.temperature) < SAMPLING_EPS for p in params):
        return greedy_walk(batch, logits, width, logit_rows)
    if logit_rows is not None:
        logits = logits[torch.as_tensor(logit_rows).to(logits.device)]
    common = dict(sampling=SamplingParamsBatch.from_params(params), generators=list(generators),
                  max_depth=width - 1, coin_rows=coin_rows)
    if q_rows is not None:
        draft_rows = torch.as_tensor(q_rows)
        if bool((draft_rows >= 0).any()):
            return accept_rrs(batch, logits, q_probs, replacement=False, draft_rows=draft_rows,
                              **common)
    return accept_target_only(batch, logits, **common)
