"""Random trees and candidates for tests and benchmarks (deterministic given a seed).

Example:
    >>> import numpy as np
    >>> t = random_tree(np.random.default_rng(0), num_draft=10)
    >>> t.num_draft
    10
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from vllm_treespec.tree.candidates import DepthTable, Expander
from vllm_treespec.tree.draft_tree import DraftTree
from vllm_treespec.tree.ngram_table import NgramTable

__all__ = ["random_tree", "random_depth_table", "random_ngram", "hashed_expander",
           "TIE_LOGPROBS"]

# Few distinct values, so random tables are full of exact score ties (tie-break coverage).
TIE_LOGPROBS = tuple(math.log(p) for p in (0.5, 0.25, 0.125, 0.0625))


def random_tree(rng: np.random.Generator, num_draft: int, vocab: int = 1000,
                max_children: int | None = None) -> DraftTree:
    """A valid random DraftTree with `num_draft` draft nodes (distinct sibling tokens)."""
    parents = [-1]
    kids: list[set[int]] = [set()]
    tokens = [int(rng.integers(vocab))]
    for i in range(1, num_draft + 1):
        while True:
            p = int(rng.integers(i))
            if max_children is None or len(kids[p]) < max_children:
                break
        while True:
            tok = int(rng.integers(vocab))
            if tok not in kids[p]:
                break
        kids[p].add(tok)
        kids.append(set())
        parents.append(p)
        tokens.append(tok)
    lp = np.log(rng.uniform(0.01, 1.0, size=num_draft + 1)).astype(np.float32)
    lp[0] = 0
    tree = DraftTree(tokens, parents, logprob=lp)
    score = np.zeros(num_draft + 1, dtype=np.float64)
    for i in range(1, num_draft + 1):
        score[i] = score[parents[i]] + lp[i]
    tree.score = score.astype(np.float32)
    return tree


def _logprob_row(rng: np.random.Generator, k: int, ties: bool) -> np.ndarray:
    if ties:
        return np.sort(rng.choice(TIE_LOGPROBS, size=k))[::-1].astype(np.float64)
    p = rng.dirichlet(np.full(max(k * 2, 2), 0.5))[:k]
    return np.sort(np.log(np.maximum(p, 1e-30)))[::-1]


def random_depth_table(rng: np.random.Generator, depth: int, k: int, vocab: int = 50, *,
                       ties: bool = False, pad: bool = False, rho=None,
                       context_len: int = 4) -> DepthTable:
    """Random top-k table; `pad` cuts some rows short with -1; `ties` uses few distinct values."""
    tokens = np.full((depth, k), -1, dtype=np.int64)
    logprobs = np.full((depth, k), -np.inf)
    for d in range(depth):
        m = int(rng.integers(0, k + 1)) if pad else k
        tokens[d, :m] = rng.choice(vocab, size=m, replace=False)
        logprobs[d, :m] = _logprob_row(rng, m, ties)
    return DepthTable(tokens, logprobs, root=int(rng.integers(vocab)),
                      context=rng.integers(vocab, size=context_len).tolist(), rho=rho)


def random_ngram(rng: np.random.Generator, vocab: int = 50, order: int = 3, entries: int = 500,
                 floor: float = -12.0) -> NgramTable:
    """Random entries over a small vocabulary, so lookups hit at every backoff length."""
    t = NgramTable(order=order, floor=floor)
    for _ in range(entries):
        n = int(rng.integers(0, order))
        t.add(tuple(rng.integers(vocab, size=n).tolist()), int(rng.integers(vocab)),
              float(-rng.exponential(2.0)))
    return t


def hashed_expander(seed: int, root: int, vocab: int = 50, *, ties: bool = False,
                    pad: bool = False, context: Sequence[int] = (), rho=None) -> Expander:
    """An Expander whose children are a deterministic pseudo-random function of the path."""

    def fn(paths, k):
        toks = np.full((len(paths), k), -1, dtype=np.int64)
        lps = np.full((len(paths), k), -np.inf)
        for i, path in enumerate(paths):
            # A fixed ranked list per path, so top-k for any k are prefixes of each other.
            r = np.random.default_rng([seed, len(path), *path])
            avail = int(r.integers(0, 6)) if pad else vocab
            ranked = r.permutation(vocab)
            row = _logprob_row(r, vocab, ties)
            m = min(k, avail)
            toks[i, :m] = ranked[:m]
            lps[i, :m] = row[:m]
        return toks, lps

    return Expander(fn, root=root, context=context, rho=rho)
