"""Checks of the inputs recursive rejection sampling (``accept_rrs``) needs: draft rows that are
distributions, drafted tokens with non-zero probability, draw counts that account for every
i.i.d. draw (verify/accept.py's module docstring says why a cut tree of merged draws is refused).
"""
from __future__ import annotations

from typing import Any

import torch

from vllm_treespec.tree.batch import TreeBatch

__all__ = ["check_draft_probs", "check_num_draws", "check_node_draws", "PROB_SUM_TOL"]

PROB_SUM_TOL = 1e-3  # tolerance on draft rows summing to 1 (float32 softmax over ~1e5 entries)


def _first(mask: torch.Tensor) -> int:
    return int(mask.nonzero()[0, 0])


def _check_draft_rows(draft_rows: Any, num_q: int, batch: TreeBatch,
                      device: torch.device) -> torch.Tensor:
    """int64 [T]: each tree row's q row (compact form) or -1; identity for the full form."""
    if draft_rows is None:
        return torch.arange(batch.num_rows, device=device)
    idx = torch.as_tensor(draft_rows, device=device)
    if idx.shape != (batch.num_rows,) or idx.dtype.is_floating_point:
        raise ValueError(f"draft_rows must be an integer tensor of shape [{batch.num_rows}] (one "
                         f"entry per tree row), got {tuple(idx.shape)} {idx.dtype}")
    idx = idx.to(torch.int64)
    if idx.numel() and (int(idx.min()) < -1 or int(idx.max()) >= num_q):
        raise ValueError(f"draft_rows entries must be -1 or a row of draft_probs (0..{num_q - 1})")
    return idx


def check_draft_probs(
    draft_probs: Any, draft_rows: Any, batch: TreeBatch, vocab: int, device: torch.device,
    full: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q rows, q row index per tree row or -1)."""
    if draft_probs is None:
        raise ValueError(
            "mode='rrs' needs draft_probs [T, V]: row u = the drafter distribution u's children "
            "were sampled from (use mode='target_only' for deterministic candidate sets)"
        )
    q = torch.as_tensor(draft_probs, device=device)
    if draft_rows is None and q.shape != (batch.num_rows, vocab):
        raise ValueError(
            f"draft_probs must have shape [T, V] = [{batch.num_rows}, {vocab}] like logits, "
            f"got {tuple(q.shape)}"
        )
    if draft_rows is not None and (q.dim() != 2 or q.shape[1] != vocab):
        raise ValueError(f"draft_probs must have shape [M, V] with V = {vocab} like logits, "
                         f"got {tuple(q.shape)}")
    if not q.dtype.is_floating_point:
        raise TypeError(f"draft_probs must be floating point, got {q.dtype}")
    index = _check_draft_rows(draft_rows, q.shape[0], batch, device)
    if full:
        _check_rows_are_distributions(q, index, batch)
    draft = batch.parents >= 0
    parent_q = index[batch.global_parents[draft]]
    has_q = parent_q >= 0
    q_drafted = q[parent_q[has_q], batch.tokens[draft][has_q]]
    if bool((q_drafted <= 0).any()):
        row = int(draft.nonzero()[has_q.nonzero()[_first(q_drafted <= 0), 0], 0])
        raise ValueError(
            f"draft token at flat row {row} has zero probability under its parent's draft_probs "
            "row, so it cannot have been sampled from it"
        )
    return q, index


def _check_rows_are_distributions(q: torch.Tensor, index: torch.Tensor, batch: TreeBatch) -> None:
    # Row sums and minima in one pass each, without copying [T, V]: a finite sum rules out
    # inf/nan entries, a non-negative minimum rules out negative ones. Only rows of nodes with
    # children matter (in the compact form: the rows such nodes point at).
    has_kids = torch.zeros(q.shape[0], dtype=torch.bool, device=q.device)
    used = (batch.num_children > 0) & (index >= 0)
    has_kids[index[used]] = True
    sums = q.sum(dim=1, dtype=torch.float32)
    bad = has_kids & ~torch.isfinite(sums)
    if not bool(bad.any()):
        bad = has_kids & (q.amin(dim=1) < 0)
    if bool(bad.any()):
        raise ValueError(
            f"draft_probs row {_first(bad)} (of a node with children) has negative, inf or nan "
            "entries"
        )
    bad = has_kids & ((sums - 1).abs() > PROB_SUM_TOL)
    if bool(bad.any()):
        row = _first(bad)
        raise ValueError(
            f"draft_probs row {row} (of a node with children) sums to {float(sums[row]):.6f}, "
            "not 1: pass probabilities (softmax of the drafter logits), not logits"
        )


def check_num_draws(
    num_draws: Any, replacement: bool, batch: TreeBatch, device: torch.device
) -> torch.Tensor | None:
    if num_draws is None:
        return None
    n = torch.as_tensor(num_draws, device=device)
    if n.shape != (batch.num_rows,) or n.dtype.is_floating_point:
        raise ValueError(f"num_draws must be an integer tensor of shape [{batch.num_rows}]")
    n = n.to(torch.int64)
    draft = batch.parents >= 0
    if bool((n[draft] < 1).any()):
        raise ValueError("num_draws must be >= 1 for every draft node")
    if not replacement and bool((n[draft] != 1).any()):
        raise ValueError(
            "num_draws > 1 only makes sense with replacement=True (draws without replacement "
            "are distinct)"
        )
    return n


def check_node_draws(node_draws: Any, draws: torch.Tensor | None, q_index: torch.Tensor,
                      batch: TreeBatch, device: torch.device) -> None:
    """replacement=True: every node with children and a q row must verify all the draws it made.

    Its children's ``num_draws`` (1 each by default) must add up to ``node_draws[u]``. A tree
    cut to a node prefix after merging repeats fails this (the cut drops the draws from the
    first cut sibling on), and verifying what is left would be biased (module docstring)."""
    if node_draws is None:
        raise ValueError(
            "mode='rrs' with replacement=True needs node_draws [T]: how many i.i.d. draws from "
            "its q row each node made (its children's num_draws must add up to it)"
        )
    made = torch.as_tensor(node_draws, device=device)
    if made.shape != (batch.num_rows,) or made.dtype.is_floating_point:
        raise ValueError(f"node_draws must be an integer tensor of shape [{batch.num_rows}]")
    draft = batch.parents >= 0
    per_child = draws[draft] if draws is not None else torch.ones_like(batch.parents[draft])
    covered = torch.zeros(batch.num_rows, dtype=torch.int64, device=device)
    covered.index_add_(0, batch.global_parents[draft], per_child)
    checked = (batch.num_children > 0) & (q_index >= 0)
    bad = checked & (covered != made.to(torch.int64))
    if bool(bad.any()):
        row = _first(bad)
        raise ValueError(
            f"node at flat row {row} made {int(made[row])} i.i.d. draws but its children stand "
            f"for {int(covered[row])} (sum of their num_draws). A tree of merged i.i.d. draws cut "
            "to a node prefix cannot be verified losslessly: which draws survive the cut depends "
            "on their values. Verify the whole tree, or draw without replacement "
            "(replacement=False), whose prefix cuts are lossless"
        )
