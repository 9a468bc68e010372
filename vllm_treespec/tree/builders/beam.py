"""`beam`: beam search with global retention (DART Alg. 1 = PRESTO Alg. 1).

Level by level, every beam node is expanded with that level's top-k candidates; *all* children
join the candidate pool T, and the best `width` children (score desc, then rank asc, then parent
id asc) form the next beam. At the end the best `budget` (DART's theta) nodes of T are kept.

Ancestor closure. DART keeps the "top-theta scoring nodes" and PRESTO the "top-B paths"; neither
says what happens if a node outscores its parent, which a score with positive increments allows
(DART's log(q + eps) terms are slightly positive when q is close to 1; custom scorers may be
anything). We rank nodes for retention by key(v) = min(score over v's path), ties broken by
depth asc, then rank asc, then parent id asc (parent id = creation order: beam position, then
rank). A parent's key is >= its child's and wins ties by depth, so every top-n set under this
order is ancestor-closed, and for non-increasing scores (all log-prob scorers) key = score, i.e.
exactly DART's/PRESTO's selection. Output order is the same ranking, so the nodes come out
topologically sorted and ``build(budget=n) == build(budget=N).prefix(n)``.

PRESTO's loop runs "while |T| < B" (stop expanding once the pool holds the budget); DART expands
all d levels. The default follows DART; ``early_stop=True`` gives PRESTO's rule (draft nodes
counted, root excluded).
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from vllm_treespec.tree.builders import _native
from vllm_treespec.tree.builders._common import (MAX_BUDGET, Scoring, assemble, check_bool,
                                                  check_candidates, check_int, resolve_depth,
                                                  resolve_topk)
from vllm_treespec.tree.candidates import DepthTable
from vllm_treespec.tree.draft_tree import DraftTree

DART_TOPK, DART_WIDTH = 25, 20


def build_beam(candidates, budget: int, *, width: int = DART_WIDTH,
               topk: int | Sequence[int] | None = None, max_depth: int | None = None,
               scorer: Any = "acc_logp", scorer_params: Mapping[str, Any] | None = None,
               early_stop: bool = False, backend: str = "auto") -> DraftTree:
    """Beam tree with global retention of `budget` nodes (DART: k=25, w=20, theta=59, d=8).

    topk: candidates per level (default min(25, table width), or 25 for an Expander);
    max_depth: default the table depth, or 8 levels for an Expander.

    Example:
        >>> import numpy as np
        >>> from vllm_treespec.tree import DepthTable, NgramTable, build_tree
        >>> ng = NgramTable(order=2).extend([((4,), 7, -0.1)])
        >>> t = DepthTable([[4, 9], [2, 7]], np.log([[.6, .3], [.8, .1]]), root=1, rho=ng)
        >>> tree = build_tree("beam", t, budget=3, width=1, scorer="presto",
        ...                   scorer_params={"lam": 1.0})
        >>> tree.draft_token_ids(), tree.parents.tolist()  # the n-gram prefers 4 -> 7 over 4 -> 2
        ([4, 9, 7], [-1, 0, 0, 1])
    """
    cand = check_candidates("beam", candidates)
    budget = check_int("beam", "budget", budget, 0, MAX_BUDGET)
    width = check_int("beam", "width", width, 1, 1 << 16)
    depth = resolve_depth("beam", cand, max_depth)
    default_k = min(DART_TOPK, cand.k) if isinstance(cand, DepthTable) else DART_TOPK
    per_level = resolve_topk("beam", cand, topk, depth, default_k)
    early_stop = check_bool("beam", "early_stop", early_stop)
    scoring = Scoring("beam", cand, scorer, scorer_params)
    if _native.use_cpp("beam", backend, cand, scoring, depth):
        return _native.beam_cpp(cand, scoring, depth, per_level, width, budget, early_stop)
    return beam_python(cand, budget, depth, per_level, width, scoring, early_stop)


def beam_python(cand, budget: int, depth: int, per_level: list[int], width: int,
                scoring: Scoring, early_stop: bool) -> DraftTree:
    """The Python builder: the only one for an Expander or a custom scorer, and for DepthTables
    the twin of the C++ one (same float64 ops and tie-breaks)."""
    table = cand if isinstance(cand, DepthTable) else None
    # Creation-ordered node columns, root first (id = index).
    chunks: dict[str, list[np.ndarray]] = {f: [] for f in
                                           ("parent", "rank", "token", "logq", "score", "key",
                                            "depth")}
    beam_ids = np.zeros(1, dtype=np.int64)
    beam_score = np.zeros(1)
    beam_key = np.full(1, np.inf)
    beam_paths: list[tuple[int, ...]] = [()]
    next_id, num_draft = 1, 0
    for level in range(depth):
        if early_stop and num_draft >= budget:
            break
        k = per_level[level]
        if beam_ids.shape[0] == 0:
            break
        if table is not None:
            row = (table.tokens[level, :k], table.logprobs[level, :k])
            rows = [row] * len(beam_paths)
        else:
            rows = cand.expand(beam_paths, k)
        parent, rank, token, logq, inc = [], [], [], [], []
        for j, (path, (toks, lq)) in enumerate(zip(beam_paths, rows)):
            m = toks.shape[0]
            parent.append(np.full(m, j, dtype=np.int64))
            rank.append(np.arange(m, dtype=np.int64))
            token.append(toks)
            logq.append(lq)
            inc.append(scoring.increments(level, path, toks, lq))
        if not parent:
            break
        local = np.concatenate(parent)
        if local.shape[0] == 0:
            break
        score = beam_score[local] + np.concatenate(inc)
        key = np.minimum(score, beam_key[local])
        pid = beam_ids[local]
        rk = np.concatenate(rank)
        tok = np.concatenate(token)
        m = local.shape[0]
        for name, arr in (("parent", pid), ("rank", rk), ("token", tok),
                          ("logq", np.concatenate(logq)), ("score", score), ("key", key),
                          ("depth", np.full(m, level + 1, dtype=np.int64))):
            chunks[name].append(arr)
        ids = np.arange(next_id, next_id + m, dtype=np.int64)
        next_id += m
        num_draft += m
        top = np.lexsort((pid, rk, -score))[:width]
        beam_ids, beam_score, beam_key = ids[top], score[top], key[top]
        beam_paths = [beam_paths[local[j]] + (int(tok[j]),) for j in top.tolist()]

    def column(name: str, root_value, dtype) -> np.ndarray:
        head = np.array([root_value], dtype=dtype)
        return np.concatenate([head] + [c.astype(dtype, copy=False) for c in chunks[name]])

    parent = column("parent", -1, np.int64)
    rank = column("rank", 0, np.int64)
    dep = column("depth", 0, np.int64)
    key = column("key", np.inf, np.float64)
    order = np.lexsort((parent[1:], rank[1:], dep[1:], -key[1:]))[:budget] + 1
    return assemble(cand.root, order, parent, column("token", cand.root, np.int64), dep,
                    column("logq", 0.0, np.float64), column("score", 0.0, np.float64))
