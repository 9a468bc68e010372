"""`threshold` (DynaTree, App. C): top-B branching to depth D, cumulative-probability pruning at
tau, hard node budget, breadth-first layout.

Deviation from the paper's pseudocode: DynaTree adds a child and only stops *expanding* leaves
whose cumulative probability is below tau (they still cost verification and budget). Here such a
child is never added, so no kept path has cumulative draft probability below tau and the budget
goes to paths that can still be accepted. Within the budget the breadth-first order is the
paper's (active leaves in order, children by rank), so ``build(budget=n) ==
build(budget=N).prefix(n)``.

`threshold_steps` is the same builder as a step generator (`_common.Expansion`): with an Expander
it yields one request per level (all active leaves) instead of calling ``expand``.
"""
from __future__ import annotations

import math

from vllm_treespec.tree.builders._common import (MAX_BUDGET, Nodes, Steps, check_candidates,
                                                  check_float, check_int, drive, resolve_depth)
from vllm_treespec.tree.candidates import DepthTable
from vllm_treespec.tree.draft_tree import DraftTree


def build_threshold(candidates, budget: int, *, branch: int = 3, max_depth: int | None = None,
                    tau: float = 0.03) -> DraftTree:
    """DynaTree tree; defaults are the paper's best setting (B=3, D=8, tau=0.03).

    max_depth defaults to 8, capped by a DepthTable's depth. Scores are accumulated log-probs.

    Example:
        >>> import numpy as np
        >>> from vllm_treespec.tree import DepthTable, build_tree
        >>> t = DepthTable([[4, 9], [2, 7]], np.log([[.6, .3], [.8, .1]]), root=1)
        >>> build_tree("threshold", t, budget=8, branch=2, tau=0.1).draft_token_ids()
        [4, 9, 2, 2]
    """
    return drive(threshold_steps(candidates, budget, branch=branch, max_depth=max_depth, tau=tau),
                 candidates)


def threshold_steps(candidates, budget: int, *, branch: int = 3, max_depth: int | None = None,
                    tau: float = 0.03) -> Steps:
    """`build_threshold` as a step generator; parameters are checked here, before the first step."""
    cand = check_candidates("threshold", candidates)
    budget = check_int("threshold", "budget", budget, 0, MAX_BUDGET)
    hi = cand.k if isinstance(cand, DepthTable) else 1024
    branch = check_int("threshold", "branch", branch, 1, hi)
    depth = resolve_depth("threshold", cand, max_depth, default=8)
    tau = check_float("threshold", "tau", tau, 0.0, 1.0, lo_open=True)
    return _threshold(cand, budget, branch, depth, math.log(tau))


def _threshold(cand, budget: int, branch: int, depth: int, log_tau: float) -> Steps:
    nodes = Nodes(cand.root)
    active = [0]
    for level in range(depth):
        if not active or len(nodes) - 1 >= budget:
            break
        if isinstance(cand, DepthTable):
            c = min(branch, int(cand.valid[level]))
            row = (cand.tokens[level, :c].tolist(), cand.logprobs[level, :c].tolist())
            kids = [row] * len(active)
        else:
            kids = [(t.tolist(), l.tolist()) for t, l in (yield nodes.expansion(active, branch))]
        new = []
        for v, (toks, lps) in zip(active, kids):
            base = nodes.score[v]
            for r, (tok, lp) in enumerate(zip(toks[:branch], lps[:branch])):
                cum = base + lp
                if cum < log_tau:
                    break  # rows are sorted by log-prob: later siblings are lower still
                if len(nodes) - 1 >= budget:
                    break
                new.append(nodes.add(v, tok, lp, cum, r))
        active = new
    return nodes.tree(range(1, len(nodes)))
