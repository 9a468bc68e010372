"""`best_first`: budget-optimal tree, the N best prefixes by path score (JetSpec accum_logp,
PRESTO Alg. 2).

Lazy push: popping a node pushes only its best child and its next sibling (children are ordered
by score increment, ties by drafter rank), so the heap grows by at most two per pop and
low-ranked siblings never crowd out better nodes. Pop order is (score desc, depth asc,
sibling-position path asc); whenever increments are <= 0 (log-probs; PRESTO with lambda >= 0)
the popped set is exactly the top-N prefixes of the candidate tree under that order, and the
output lists nodes in pop order, so ``build(budget=n) == build(budget=N).prefix(n)``.

JetSpec's Algorithm 1 pushes all b children of a popped node; with lazy push the selected set is
the same and the work per pop is O(log heap) instead of O(b log heap).

``greedy_spine=True`` always keeps the chain of best children (the drafter's top-1 chain under
acc_logp) to depth min(max_depth, budget) and fills the remaining budget best-first; the output
is then ordered by (min score along the path desc, depth, position path), still topological.

`best_first_steps` is the same builder as a step generator (`_common.Expansion`): with an Expander
it yields one request per node whose children it needs (one path: the root, then each popped
node, and with greedy_spine first each spine node) instead of calling ``expand``. Children are
fetched lazily, the first time a node's children are needed, so the requests come in the same
order and number as the synchronous builder's ``expand`` calls.

``prefetch=m`` (m > 1) asks for the children of up to m-1 more nodes in the same request: the
next nodes on the heap (the likeliest next pops) whose children are not known yet. The tree is
the same (children are a function of the path; which are fetched early changes nothing that is
selected); what changes is the number of requests. For a draft LM, where one batched call costs
about the same for one path as for a few, the node-by-node rounds (up to about the budget) fall
to about budget / m, at the price of some expansions of nodes that are never popped (at most
budget of them: never more than 2 * budget expansions in all).
"""
from __future__ import annotations

import heapq
import math
from typing import Any, Mapping, Sequence

import numpy as np

from vllm_treespec.tree.builders import _native
from vllm_treespec.tree.builders._common import (MAX_BUDGET, Nodes, Scoring, Steps, check_bool,
                                                  check_candidates, check_int, drive, finished,
                                                  resolve_depth, resolve_topk)
from vllm_treespec.tree.candidates import DepthTable
from vllm_treespec.tree.draft_tree import DraftTree

DEFAULT_EXPANDER_TOPK = 8


def build_best_first(candidates, budget: int, *, topk: int | Sequence[int] | None = None,
                     max_depth: int | None = None, scorer: Any = "acc_logp",
                     scorer_params: Mapping[str, Any] | None = None, greedy_spine: bool = False,
                     backend: str = "auto", prefetch: int = 1) -> DraftTree:
    """Best-first tree of `budget` draft nodes.

    topk: children considered per node (default: the whole table row, or 8 for an Expander);
    max_depth: default the table depth, or 8 levels for an Expander; prefetch: nodes whose
    children one Expander request asks for (module docstring; no effect on the tree).

    Example:
        >>> import numpy as np
        >>> from vllm_treespec.tree import DepthTable, build_tree
        >>> t = DepthTable([[4, 9], [2, 7]], np.log([[.6, .3], [.8, .1]]), root=1)
        >>> build_tree("best_first", t, budget=3).draft_token_ids()   # .6, .48, .3
        [4, 2, 9]
    """
    return drive(best_first_steps(candidates, budget, topk=topk, max_depth=max_depth,
                                  scorer=scorer, scorer_params=scorer_params,
                                  greedy_spine=greedy_spine, backend=backend, prefetch=prefetch),
                 candidates)


def best_first_steps(candidates, budget: int, *, topk: int | Sequence[int] | None = None,
                     max_depth: int | None = None, scorer: Any = "acc_logp",
                     scorer_params: Mapping[str, Any] | None = None, greedy_spine: bool = False,
                     backend: str = "auto", prefetch: int = 1) -> Steps:
    """`build_best_first` as a step generator; parameters are checked here, before the first step.

    The C++ path (DepthTable only) expands nothing: its generator just returns the tree.
    """
    cand = check_candidates("best_first", candidates)
    budget = check_int("best_first", "budget", budget, 0, MAX_BUDGET)
    depth = resolve_depth("best_first", cand, max_depth)
    default_k = cand.k if isinstance(cand, DepthTable) else DEFAULT_EXPANDER_TOPK
    per_level = resolve_topk("best_first", cand, topk, depth, default_k)
    greedy_spine = check_bool("best_first", "greedy_spine", greedy_spine)
    prefetch = check_int("best_first", "prefetch", prefetch, 1, MAX_BUDGET)
    scoring = Scoring("best_first", cand, scorer, scorer_params)
    if _native.use_cpp("best_first", backend, cand, scoring, depth):
        return finished(_native.best_first_cpp, cand, scoring, depth, per_level, budget,
                        greedy_spine)
    return best_first_python_steps(cand, budget, depth, per_level, scoring, greedy_spine, prefetch)


def best_first_python_steps(cand, budget: int, depth: int, per_level: list[int],
                            scoring: Scoring, greedy_spine: bool, prefetch: int = 1) -> Steps:
    """The Python builder as a step generator: the only one for an Expander or a custom scorer,
    and for DepthTables the twin of the C++ one (same order of float ops and tie-breaks)."""
    table = cand if isinstance(cand, DepthTable) else None
    nodes = Nodes(cand.root)
    pos, pospath, key = [0], [()], [math.inf]
    kids: dict[int, tuple[list, list, list, list]] = {}  # node -> sorted (rank, token, logq, inc)
    heap: list = []                                       # (-score, depth, pospath, node)
    selected: list[int] = []                              # popped nodes, in pop order
    expanded = 0                                          # non-root nodes sent for expansion
    level_kids: dict[int, tuple[list, list, list, list]] = {}

    def path_blind(level: int) -> bool:
        if table is None:
            return False
        if scoring.linear:
            return scoring.level(level)[1] == 0.0
        return scoring.rho is None

    def sorted_kids(v: int, toks, lq) -> tuple[list, list, list, list]:
        inc = scoring.increments(nodes.depth[v], nodes.path(v), toks, lq)
        order = np.lexsort((np.arange(inc.shape[0]), -inc))
        return order.tolist(), toks[order].tolist(), lq[order].tolist(), inc[order].tolist()

    def fetch(v: int):
        """Sorted children of v into kids[v]; a step generator (yields v's Expansion if any)."""
        nonlocal expanded
        level = nodes.depth[v]
        if level >= depth:
            got = ([], [], [], [])
        elif path_blind(level) and level in level_kids:
            got = level_kids[level]
        else:
            k = per_level[level]
            if table is not None:
                got = sorted_kids(v, table.tokens[level, :k], table.logprobs[level, :k])
            else:
                ahead = prefetch_candidates(v, k) if prefetch > 1 else []
                expanded += (v != 0) + len(ahead)
                answers = yield nodes.expansion([v, *ahead], k)
                got = sorted_kids(v, *answers[0])
                for u, (toks, lq) in zip(ahead, answers[1:]):
                    kids[u] = sorted_kids(u, toks, lq)
            if path_blind(level):
                level_kids[level] = got
        kids[v] = got
        return got

    def prefetch_candidates(v: int, k: int) -> list[int]:
        """Up to prefetch-1 heap nodes, best first, whose children (top-k, as v's) are unknown.

        Never more than 2 * budget non-root expansions in all (without prefetch: at most one
        per selected node, so budget), keeping room for the fetches the remaining pops may
        need; a drafter holding 2 * budget tree nodes per request never runs out."""
        pops_left = budget - len(selected)      # each may still fetch one node
        room = min(prefetch - 1, 2 * budget - expanded - (v != 0) - pops_left)
        out: list[int] = []
        if room <= 0:
            return out
        for entry in sorted(heap):
            u = entry[3]
            if u != v and u not in kids and nodes.depth[u] < depth and per_level[nodes.depth[u]] == k:
                out.append(u)
                if len(out) == room:
                    break
        return out

    def make_child(v: int, i: int) -> int:
        ranks, toks, lqs, incs = kids[v]  # fetched before any child of v is made
        s = nodes.score[v] + incs[i]
        c = nodes.add(v, toks[i], lqs[i], s, ranks[i])
        pos.append(i)
        pospath.append(pospath[v] + (i,))
        key.append(s if s < key[v] else key[v])
        return c

    spine_child: dict[int, int] = {}
    spine: set[int] = set()
    if greedy_spine:
        v = 0
        while len(spine) < budget:
            if v not in kids:
                yield from fetch(v)
            if not kids[v][0]:
                break
            c = make_child(v, 0)
            spine_child[v] = c
            spine.add(c)
            v = c

    def first_child(v: int):
        """v's best child (made on first use), -1 if none; a step generator like fetch."""
        if v not in kids:
            yield from fetch(v)
        if not kids[v][0]:
            return -1
        c = spine_child.get(v)
        return c if c is not None else make_child(v, 0)

    def push(c: int) -> None:
        heapq.heappush(heap, (-nodes.score[c], nodes.depth[c], pospath[c], c))

    need = budget - len(spine)
    picked = 0
    if budget > 0:
        c = yield from first_child(0)
        if c >= 0:
            push(c)
    while picked < need and heap:
        v = heapq.heappop(heap)[3]
        selected.append(v)
        if v not in spine:
            picked += 1
        c = yield from first_child(v)
        if c >= 0:
            push(c)
        p = nodes.parent[v]
        if pos[v] + 1 < len(kids[p][0]):
            push(make_child(p, pos[v] + 1))
    if greedy_spine:
        chosen = set(selected)
        selected += sorted(s for s in spine if s not in chosen)
        selected.sort(key=lambda v: (-key[v], nodes.depth[v], pospath[v]))
    return nodes.tree(selected)
