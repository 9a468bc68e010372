"""`static`: a fixed per-depth fan-out template, e.g. (3, 2, 2, 1) (Medusa, Mamba drafters).

Every node at depth d gets the top template[d] children of depth d+1, so the shape depends only
on the template and the budget, never on the scores (predictable verify cost). Nodes are laid out
breadth-first (parents in order, children by rank); over budget, the breadth-first prefix is kept,
so ``build(budget=n) == build(budget=N).prefix(n)``.

`static_steps` is the same builder as a step generator (`_common.Expansion`): with an Expander it
yields one request per level (all of that level's nodes) instead of calling ``expand``, so
`vllm_treespec.tree.lockstep` can batch many requests' levels into one drafter call.
"""
from __future__ import annotations

from typing import Sequence

from vllm_treespec.tree.builders._common import (MAX_BUDGET, MAX_DEPTH, BuildError, Nodes, Steps,
                                                  check_candidates, check_int, drive)
from vllm_treespec.tree.candidates import DepthTable
from vllm_treespec.tree.draft_tree import DraftTree

DEFAULT_TEMPLATE = (3, 2, 2, 1)


def check_template(builder: str, template, cand) -> tuple[int, ...]:
    if isinstance(template, (str, bytes)) or not isinstance(template, Sequence) or not template:
        raise BuildError(f"builder {builder!r}: parameter 'template' must be a non-empty "
                         f"sequence of fan-outs (ints >= 1), got {template!r}")
    hi = cand.k if isinstance(cand, DepthTable) else 1024
    tpl = tuple(check_int(builder, "template", f, 1, hi) for f in template)
    max_levels = cand.depth if isinstance(cand, DepthTable) else MAX_DEPTH
    if len(tpl) > max_levels:
        raise BuildError(f"builder {builder!r}: parameter 'template' has {len(tpl)} levels but "
                         f"the candidates have only {max_levels}")
    return tpl


def build_static(candidates, budget: int, *,
                 template: Sequence[int] = DEFAULT_TEMPLATE) -> DraftTree:
    """Template tree, breadth-first, cut to `budget` draft nodes; scores = accumulated log-prob.

    Example:
        >>> import numpy as np
        >>> from vllm_treespec.tree import DepthTable, build_tree
        >>> t = DepthTable([[4, 9], [2, 7]], np.log([[.6, .3], [.8, .1]]), root=1)
        >>> build_tree("static", t, budget=8, template=(2, 1)).parents.tolist()
        [-1, 0, 0, 1, 2]
    """
    return drive(static_steps(candidates, budget, template=template), candidates)


def static_steps(candidates, budget: int, *, template: Sequence[int] = DEFAULT_TEMPLATE) -> Steps:
    """`build_static` as a step generator; parameters are checked here, before the first step."""
    cand = check_candidates("static", candidates)
    budget = check_int("static", "budget", budget, 0, MAX_BUDGET)
    return _static(cand, budget, check_template("static", template, cand))


def _static(cand, budget: int, tpl: tuple[int, ...]) -> Steps:
    nodes = Nodes(cand.root)
    level_nodes = [0]
    for level, fan in enumerate(tpl):
        if not level_nodes or len(nodes) - 1 >= budget:
            break
        if isinstance(cand, DepthTable):
            c = min(fan, int(cand.valid[level]))
            row = (cand.tokens[level, :c].tolist(), cand.logprobs[level, :c].tolist())
            kids = [row] * len(level_nodes)
        else:
            kids = [(t.tolist(), l.tolist())
                    for t, l in (yield nodes.expansion(level_nodes, fan))]
        new = []
        for v, (toks, lps) in zip(level_nodes, kids):
            for r, (tok, lp) in enumerate(zip(toks[:fan], lps[:fan])):
                if len(nodes) - 1 >= budget:
                    break
                new.append(nodes.add(v, tok, lp, nodes.score[v] + lp, r))
        level_nodes = new
    return nodes.tree(range(1, len(nodes)))
