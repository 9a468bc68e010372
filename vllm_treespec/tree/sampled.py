"""Sampled draft trees: each node's children are DRAWS from the drafter's distribution q, kept in
draw order, so recursive rejection sampling (verify/accept.py, mode ``rrs``) can verify them.

RRS at a node is lossless when, given everything drafted before, its children are draws from
that node's q in the order they were drawn (SpecInfer, Sequoia). A builder must therefore never
choose a child by its own value: the top-k builders' ranking, DynaTree's "drop a child below tau"
or a budget that prefers likely siblings would keep some draws and not others depending on what
was drawn, and the kept ones would no longer follow q. What a builder may decide from values is
how many draws a node gets before they are drawn (from q and its ancestors) and which drawn
children it expands further. So for temperature > 0 with ``draft_sampling: sample``:

==========  =====================================================================================
chain       one draw per node, to max_depth (standard speculative sampling)
static      template[d] draws at every node of depth d (the template / bandit shapes)
threshold   DynaTree as in the paper's pseudocode: B draws at every active node; a drawn child
            whose cumulative draft probability is below tau is KEPT (it was drawn) but not
            expanded; to depth D
==========  =====================================================================================

Nodes are laid out breadth-first (parents in order, children in draw order) and the budget cuts
that order, which keeps a prefix of every node's draws; the engine's scheduler cut (a prefix of
the node list) does the same. Draws are without replacement (Gumbel-top-k keys), so siblings are
distinct and verified with ``replacement=False``.

The generator speaks `run_lockstep`'s protocol (``ordered=True``: children in the order given).
"""
from __future__ import annotations

import math
from typing import Any

from vllm_treespec.tree.builders._common import (MAX_BUDGET, MAX_DEPTH, BuildError, Nodes, Steps,
                                                  check_float, check_int)
from vllm_treespec.tree.builders.static import DEFAULT_TEMPLATE, check_template

__all__ = ["SAMPLED_BUILDERS", "sampled_steps"]

SAMPLED_BUILDERS = ("chain", "static", "threshold")
_PARAMS = {"chain": {"max_depth"}, "static": {"template"}, "threshold": {"branch", "max_depth", "tau"}}


def sampled_steps(builder: str, root: int, budget: int, **params: Any) -> Steps:
    """Step generator of a sampled tree (module docstring); parameters as the top-k builder's.

    It yields `Expansion`s whose ``k`` is the number of draws wanted per node, and must be sent,
    per path, the drawn tokens in draw order and their log q (-1 padding allowed when q has
    fewer tokens than draws); it returns the DraftTree (node ids = tree indices).
    """
    if builder not in SAMPLED_BUILDERS:
        raise BuildError(f"tree builder {builder!r} cannot build sampled trees (it ranks children "
                         f"by value); use one of {', '.join(SAMPLED_BUILDERS)}")
    unknown = sorted(set(params) - _PARAMS[builder])
    if unknown:
        raise BuildError(f"builder {builder!r}: unknown parameter(s) {unknown}; allowed: "
                         f"{', '.join(sorted(_PARAMS[builder]))}")
    budget = check_int(builder, "budget", budget, 0, MAX_BUDGET)
    log_tau = -math.inf
    if builder == "static":
        fanouts = check_template(builder, params.get("template", DEFAULT_TEMPLATE), None)
    else:
        depth = params.get("max_depth")
        depth = 8 if depth is None else check_int(builder, "max_depth", depth, 0, MAX_DEPTH)
        branch = 1
        if builder == "threshold":
            branch = check_int(builder, "branch", params.get("branch", 3), 1, 1024)
            log_tau = math.log(check_float(builder, "tau", params.get("tau", 0.03), 0.0, 1.0,
                                           lo_open=True))
        fanouts = (branch,) * depth
    return _sampled(int(root), budget, fanouts, log_tau)


def _sampled(root: int, budget: int, fanouts: tuple[int, ...], log_tau: float) -> Steps:
    nodes = Nodes(root)
    active = [0]
    for fan in fanouts:
        if not active or len(nodes) - 1 >= budget:
            break
        kids = yield nodes.expansion(active, fan)
        new = []
        for v, (toks, lps) in zip(active, kids):
            for r, (tok, lp) in enumerate(zip(toks.tolist()[:fan], lps.tolist()[:fan])):
                if len(nodes) - 1 >= budget:
                    break
                node = nodes.add(v, tok, lp, nodes.score[v] + lp, r)
                if nodes.score[node] >= log_tau:
                    new.append(node)
        active = new
    return nodes.tree(range(1, len(nodes)))
