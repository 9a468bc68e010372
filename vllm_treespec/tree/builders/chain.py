"""`chain`: the top-1 chain (fan-out 1), the degenerate tree the linear engine path uses.

`chain_steps` is the same builder as a step generator (`_common.Expansion`): with an Expander it
yields one request per level (the chain's last node, id = its depth) instead of calling ``expand``.
"""
from __future__ import annotations

import numpy as np

from vllm_treespec.tree.builders._common import (MAX_BUDGET, Expansion, Steps, check_candidates,
                                                  check_int, drive, resolve_depth)
from vllm_treespec.tree.candidates import DepthTable
from vllm_treespec.tree.draft_tree import DraftTree


def build_chain(candidates, budget: int, *, max_depth: int | None = None) -> DraftTree:
    """Root -> top-1 at depth 1 -> top-1 at depth 2 ..., min(budget, max_depth) nodes.

    max_depth defaults to the table depth (DepthTable) or 8 levels (Expander). Scores are the
    accumulated draft log-probs.

    Example:
        >>> import numpy as np
        >>> from vllm_treespec.tree import DepthTable, build_tree
        >>> t = DepthTable([[4, 9], [2, 7]], np.log([[.6, .3], [.8, .1]]), root=1)
        >>> build_tree("chain", t, budget=8).draft_token_ids()
        [4, 2]
    """
    return drive(chain_steps(candidates, budget, max_depth=max_depth), candidates)


def chain_steps(candidates, budget: int, *, max_depth: int | None = None) -> Steps:
    """`build_chain` as a step generator; parameters are checked here, before the first step."""
    cand = check_candidates("chain", candidates)
    budget = check_int("chain", "budget", budget, 0, MAX_BUDGET)
    n = min(budget, resolve_depth("chain", cand, max_depth))
    return _chain(cand, n)


def _chain(cand, n: int) -> Steps:
    if isinstance(cand, DepthTable):
        empty = np.nonzero(cand.valid[:n] == 0)[0]
        if empty.size:
            n = int(empty[0])
        toks, lps = cand.tokens[:n, 0].tolist(), cand.logprobs[:n, 0].tolist()
    else:
        toks, lps, path = [], [], ()
        while len(toks) < n:
            d = len(path)  # node ids: the chain's nodes in creation order, root = 0
            kids, kid_lp = (yield Expansion([path], 1, [d], [d - 1]))[0]
            if kids.shape[0] == 0:
                break
            toks.append(int(kids[0]))
            lps.append(float(kid_lp[0]))
            path = path + (toks[-1],)
    m = len(toks)
    lp = np.zeros(m + 1, dtype=np.float64)
    lp[1:] = lps
    return DraftTree(np.array([cand.root, *toks], dtype=np.int64), np.arange(-1, m, dtype=np.int64),
                     np.arange(m + 1, dtype=np.int64), lp.astype(np.float32),
                     np.cumsum(lp).astype(np.float32), validate=False)
