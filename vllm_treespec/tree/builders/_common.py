"""Helpers shared by the builders: parameter checks, scoring of children, tree assembly."""
from __future__ import annotations

import math
from typing import Any, Generator, NamedTuple, Sequence

import numpy as np

from vllm_treespec.tree.candidates import DepthTable, Expander
from vllm_treespec.tree.draft_tree import DraftTree
from vllm_treespec.tree.scorers import LinearScorer, make_scorer, smooth_log

MAX_BUDGET = 1 << 16
MAX_DEPTH = 256
DEFAULT_EXPANDER_DEPTH = 8


class BuildError(ValueError):
    """Bad builder name, parameter or candidates; the message names the parameter and range."""


class Expansion(NamedTuple):
    """One expansion request a builder's step generator yields (Expander candidates only).

    The generator expects back exactly what ``Expander.expand(paths, k)`` returns: one cleaned
    ``(tokens int64[m], logprobs float64[m])`` pair per path, m <= k, rank 0 first
    (`vllm_treespec.tree.candidates.clean_children`). ``paths`` is never empty.

    ``node_ids[i]`` is the builder's internal id of the node ``paths[i]`` ends at and
    ``parent_ids[i]`` the id of its parent (-1 for the root). Ids number the nodes of one
    request's tree in creation order, root = 0 (`Nodes`); a node is created when its parent's
    expansion returns it, so a node's parent was always expanded in an earlier request. They
    are not the final DraftTree's indices in general (best_first outputs nodes in pop order and
    drops nodes it created but never picked).
    """
    paths: list[tuple[int, ...]]
    k: int
    node_ids: list[int]
    parent_ids: list[int]


# A builder's step generator: yields Expansions, is sent the cleaned children, returns its tree.
Steps = Generator[Expansion, "list[tuple[np.ndarray, np.ndarray]]", DraftTree]


def drive(steps: Steps, cand) -> DraftTree:
    """Run a step generator to its tree, answering each Expansion with ``cand.expand``."""
    try:
        req = next(steps)
    except StopIteration as done:
        return done.value
    while True:
        kids = cand.expand(req.paths, req.k)
        try:
            req = steps.send(kids)
        except StopIteration as done:
            return done.value


def finished(build, *args) -> Steps:
    """A step generator that expands nothing and returns ``build(*args)`` (run on first next)."""
    return build(*args)
    yield  # unreachable: makes this function a generator


def check_int(builder: str, name: str, value: Any, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise BuildError(f"builder {builder!r}: parameter {name!r} must be an int in "
                         f"[{lo}, {hi}], got {value!r}")
    return int(value)


def check_float(builder: str, name: str, value: Any, lo: float, hi: float, *,
                lo_open: bool = False, hi_open: bool = False) -> float:
    ok = (isinstance(value, (int, float, np.floating)) and not isinstance(value, bool)
          and math.isfinite(value))
    if ok:
        ok = (value > lo if lo_open else value >= lo) and (value < hi if hi_open else value <= hi)
    if not ok:
        rng = f"{'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
        raise BuildError(f"builder {builder!r}: parameter {name!r} must be a number in {rng}, "
                         f"got {value!r}")
    return float(value)


def check_bool(builder: str, name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise BuildError(f"builder {builder!r}: parameter {name!r} must be true or false, "
                         f"got {value!r}")
    return bool(value)


def check_candidates(builder: str, cand: Any) -> DepthTable | Expander:
    if not isinstance(cand, (DepthTable, Expander)):
        raise BuildError(f"builder {builder!r}: candidates must be a DepthTable or an Expander, "
                         f"got {type(cand).__name__}")
    return cand


def resolve_depth(builder: str, cand, max_depth: int | None, default: int | None = None) -> int:
    """max_depth param: defaults to the table depth (capped by `default`) or `default` levels."""
    if isinstance(cand, DepthTable):
        if max_depth is None:
            return cand.depth if default is None else min(default, cand.depth)
        return check_int(builder, "max_depth", max_depth, 0, cand.depth)
    if max_depth is None:
        return DEFAULT_EXPANDER_DEPTH if default is None else default
    return check_int(builder, "max_depth", max_depth, 0, MAX_DEPTH)


def resolve_topk(builder: str, cand, topk: int | Sequence[int] | None, depth: int,
                 default: int) -> list[int]:
    """Per-level candidate counts; for a DepthTable capped by each row's real entries."""
    if topk is None:
        per = [default] * depth
    elif isinstance(topk, (int, np.integer)) and not isinstance(topk, bool):
        per = [topk] * depth
    else:
        per = list(topk)
        if len(per) < depth:
            raise BuildError(f"builder {builder!r}: parameter 'topk' needs one entry per level "
                             f"({depth}), got {len(per)}")
        per = per[:depth]
    hi = cand.k if isinstance(cand, DepthTable) else 1024
    for k in set(per):
        check_int(builder, "topk", k, 1, hi)
    if isinstance(cand, DepthTable):
        return np.minimum(np.asarray(per, dtype=np.int64), cand.valid[:depth]).tolist()
    return [int(k) for k in per]


class Scoring:
    """Applies a scorer to a node's children (one level's candidates under one path)."""

    def __init__(self, builder: str, cand, scorer, scorer_params):
        try:
            self.scorer = make_scorer(scorer, scorer_params)
        except ValueError as e:
            raise BuildError(f"builder {builder!r}: {e}") from None
        self.rho = cand.rho
        if getattr(self.scorer, "needs_rho", False) and self.rho is None:
            raise BuildError(
                f"builder {builder!r}: scorer {getattr(self.scorer, 'name', self.scorer)!r} "
                f"needs an n-gram signal: pass rho= to the "
                f"{getattr(cand, 'rho_owner', type(cand).__name__)}")
        self.linear = isinstance(self.scorer, LinearScorer)
        self.base_ctx = cand.context + (cand.root,)
        self.table = cand if isinstance(cand, DepthTable) else None
        self._coeffs: tuple[list[float], list[float], list[float]] | None = None
        self._levels: dict[int, tuple[np.ndarray, float, float]] = {}

    def coeffs(self) -> tuple[list[float], list[float], list[float]]:
        """Per-level (a, b, c) of a linear scorer over a DepthTable (computed once)."""
        if self._coeffs is None:
            t, s = self.table, self.scorer
            ent = t.entropies() if s.uses_entropy() else np.zeros(t.depth)
            abc = [s.coeffs(level, float(ent[level])) for level in range(t.depth)]
            self._coeffs = ([float(x[0]) for x in abc], [float(x[1]) for x in abc],
                            [float(x[2]) for x in abc])
        return self._coeffs

    def level(self, level: int) -> tuple[np.ndarray, float, float]:
        """(unary = a * f(log q) over the row's real entries, b, c) for a DepthTable level."""
        got = self._levels.get(level)
        if got is None:
            a, b, c = self.coeffs()
            t, s = self.table, self.scorer
            lq = t.logprobs[level, :int(t.valid[level])]
            f = smooth_log(lq, s.eps) if s.eps is not None else lq
            got = self._levels[level] = (a[level] * f, b[level], c[level])
        return got

    def _rho(self, path: tuple[int, ...], tokens: np.ndarray) -> np.ndarray:
        g = np.asarray(self.rho.logprobs(self.base_ctx + path, tokens), dtype=np.float64)
        if g.shape != tokens.shape or np.any(np.isnan(g)) or np.any(g == np.inf):
            raise BuildError(f"n-gram signal returned {g!r} for {tokens.shape[0]} candidates; "
                             f"expected finite or -inf log-probs")
        return g

    def increments(self, level: int, path: tuple[int, ...], tokens: np.ndarray,
                   logq: np.ndarray) -> np.ndarray:
        """Score increments of `tokens` (with drafter log-probs `logq`) as children of `path`."""
        s = self.scorer
        if not self.linear:
            ent = -float(np.sum(np.exp(logq) * logq))
            logrho = self._rho(path, tokens) if self.rho is not None else None
            inc = np.asarray(s.increments(level, logq, logrho, ent), dtype=np.float64)
            if inc.shape != tokens.shape or np.any(np.isnan(inc)):
                raise BuildError(f"scorer {s!r} returned {inc!r}; expected {tokens.shape[0]} "
                                 f"numbers")
            return inc
        if self.table is not None:
            unary, b, c = self.level(level)
            unary = unary[:tokens.shape[0]]
        else:
            ent = -float(np.sum(np.exp(logq) * logq)) if s.uses_entropy() else 0.0
            _, b, c = s.coeffs(level, ent)
            unary = s.unary(level, logq, ent)
        g = s.ngram_term(self._rho(path, tokens)) if b != 0.0 else None
        return s.combine(unary, b, c, g)


class Nodes:
    """Growing node store for Python builders; id 0 is the root."""

    __slots__ = ("parent", "token", "depth", "logq", "score", "rank")

    def __init__(self, root: int):
        self.parent = [-1]
        self.token = [root]
        self.depth = [0]
        self.logq = [0.0]
        self.score = [0.0]
        self.rank = [0]

    def add(self, parent: int, token: int, logq: float, score: float, rank: int) -> int:
        self.parent.append(parent)
        self.token.append(token)
        self.depth.append(self.depth[parent] + 1)
        self.logq.append(logq)
        self.score.append(score)
        self.rank.append(rank)
        return len(self.parent) - 1

    def __len__(self) -> int:
        return len(self.parent)

    def expansion(self, vs: Sequence[int], k: int) -> Expansion:
        """The request to expand nodes `vs` (ids) with their top-`k` children."""
        return Expansion([self.path(v) for v in vs], int(k), list(vs),
                         [self.parent[v] for v in vs])

    def path(self, v: int) -> tuple[int, ...]:
        out = []
        while v > 0:
            out.append(self.token[v])
            v = self.parent[v]
        return tuple(reversed(out))

    def tree(self, order: Sequence[int]) -> DraftTree:
        """DraftTree of the root plus nodes `order` (ids, topological) in that order."""
        return assemble(self.token[0], np.asarray(order, dtype=np.int64),
                        np.asarray(self.parent, dtype=np.int64),
                        np.asarray(self.token, dtype=np.int64),
                        np.asarray(self.depth, dtype=np.int64),
                        np.asarray(self.logq, dtype=np.float64),
                        np.asarray(self.score, dtype=np.float64))


def assemble(root: int, order: np.ndarray, parent: np.ndarray, token: np.ndarray,
             depth: np.ndarray, logq: np.ndarray, score: np.ndarray) -> DraftTree:
    """Select node ids `order` (topological, parent ids refer to the same id space, 0 = root)."""
    n = order.shape[0]
    pos = np.full(parent.shape[0], -1, dtype=np.int64)
    pos[0] = 0
    pos[order] = np.arange(1, n + 1)
    par = np.empty(n + 1, dtype=np.int64)
    par[0] = -1
    par[1:] = pos[parent[order]]
    if n and ((par[1:] < 0).any() or (par[1:] >= np.arange(1, n + 1)).any()):
        raise AssertionError("builder produced a non-topological or non-closed node order")
    tok = np.empty(n + 1, dtype=np.int64)
    tok[0], tok[1:] = root, token[order]
    dep = np.zeros(n + 1, dtype=np.int64)
    dep[1:] = depth[order]
    lp = np.zeros(n + 1, dtype=np.float32)
    lp[1:] = logq[order]
    sc = np.zeros(n + 1, dtype=np.float32)
    sc[1:] = score[order]
    return DraftTree(tok, par, dep, lp, sc, validate=False)
