"""Candidates: what a drafter hands a tree builder (docs/design.md section 2).

Two shapes, because drafters come in two kinds:

* `DepthTable` - per future depth d, the top-k token ids and log-probs, the same for every prefix
  (DART, JetSpec, DFlash-style heads produce all depths in one forward). Optionally a
  prefix-conditioned signal ``rho`` (an n-gram model) for PRESTO / DART scoring.
* `Expander` - a batched callable ``expand(paths, k) -> (tokens [n, k], logprobs [n, k])`` that
  gives the top-k children of each path (autoregressive draft models, the n-gram trie, prompt
  lookup). Paths are tuples of draft tokens after the root; ``()`` is the root itself.

Both carry ``root`` (the last sampled token, node 0 of the tree) and ``context`` (committed tokens
before the root, oldest first; only the n-gram signal reads it). The n-gram signal sees the context
``context + (root,) + path``.

Example:
    >>> import numpy as np
    >>> table = DepthTable(tokens=[[4, 9], [2, 7]], logprobs=np.log([[.6, .3], [.8, .1]]), root=1)
    >>> table.depth, table.k
    (2, 2)
"""
from __future__ import annotations

import math
from typing import Callable, Protocol, Sequence, runtime_checkable

import numpy as np

__all__ = ["DepthTable", "Expander", "NgramSignal", "as_ngram_signal", "CandidateError",
           "clean_children"]


class CandidateError(ValueError):
    """Drafter output that a builder cannot use (shape, padding, duplicates, bad log-probs)."""


@runtime_checkable
class NgramSignal(Protocol):
    """log rho(token | context) for a batch of candidate tokens sharing one context.

    Both the pure-Python `NgramTable` and the C++ `_C.NgramTable` (and later the n-gram trie)
    implement it. ``context`` is the full token context ending with the path's last token.
    """

    def logprobs(self, context: Sequence[int], candidates: np.ndarray) -> np.ndarray: ...


class _CallableSignal:
    """Adapts ``f(context: tuple, token: int) -> float`` to `NgramSignal`."""

    def __init__(self, fn: Callable[[tuple, int], float]):
        self.fn = fn

    def logprobs(self, context: Sequence[int], candidates: np.ndarray) -> np.ndarray:
        ctx = tuple(int(t) for t in context)
        return np.array([float(self.fn(ctx, int(t))) for t in candidates], dtype=np.float64)


def as_ngram_signal(rho) -> NgramSignal | None:
    """None, an object with ``logprobs(context, candidates)``, or a callable (context, token)."""
    if rho is None or hasattr(rho, "logprobs"):
        return rho
    if callable(rho):
        return _CallableSignal(rho)
    raise CandidateError(
        f"rho must be None, an object with logprobs(context, candidates), or a callable "
        f"(context, token) -> log rho; got {type(rho).__name__}")


def _check_root(root, context) -> tuple[int, tuple[int, ...]]:
    if not isinstance(root, (int, np.integer)) or root < 0:
        raise CandidateError(f"root must be a non-negative token id, got {root!r}")
    try:
        ctx = tuple(int(t) for t in context)
    except TypeError as e:
        raise CandidateError(f"context must be a sequence of token ids: {e}") from None
    return int(root), ctx


class DepthTable:
    """Prefix-blind per-depth top-k candidates (row d = future depth d+1).

    ``tokens`` int [D, K] with -1 padding only at the end of a row; tokens distinct within a row;
    ``logprobs`` [D, K] finite and non-increasing along each row over the real entries (rank 0 is
    the drafter's top-1). ``entropy`` (optional, [D]) is the full-vocabulary entropy of each
    depth's distribution for PRESTO's entropy-adaptive lambda; without it the builders use the
    entropy of the top-k entries (a lower bound).
    """

    __slots__ = ("tokens", "logprobs", "root", "context", "rho", "entropy", "valid")

    def __init__(self, tokens, logprobs, root: int, context: Sequence[int] = (), rho=None,
                 entropy: Sequence[float] | None = None):
        self.root, self.context = _check_root(root, context)
        tok = np.asarray(tokens)
        lp = np.asarray(logprobs, dtype=np.float64)
        if tok.ndim != 2 or tok.shape[0] < 1:
            raise CandidateError(f"DepthTable tokens must be 2-D [depth, k], got shape {tok.shape}")
        if lp.shape != tok.shape:
            raise CandidateError(
                f"DepthTable logprobs shape {lp.shape} != tokens shape {tok.shape}")
        tok = np.ascontiguousarray(tok, dtype=np.int64)
        valid = tok >= 0
        if np.any(tok < -1):
            raise CandidateError("DepthTable tokens must be token ids >= 0 or -1 padding")
        late = valid[:, 1:] & ~valid[:, :-1]
        if late.any():
            d = int(np.nonzero(late.any(axis=1))[0][0])
            raise CandidateError(
                f"DepthTable row {d} has -1 padding before a real token: pad only at the end")
        srt = np.sort(tok, axis=1)
        dup = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)
        if dup.any():
            d = int(np.nonzero(dup.any(axis=1))[0][0])
            raise CandidateError(f"DepthTable row {d} repeats a token: {tok[d].tolist()}")
        bad = valid & ~(np.isfinite(lp) & (lp <= 1e-6))
        if bad.any():
            d = int(np.nonzero(bad.any(axis=1))[0][0])
            raise CandidateError(f"DepthTable row {d} log-probs must be finite and <= 0, got "
                                 f"{lp[d][valid[d]].tolist()}")
        rising = (lp[:, 1:] > lp[:, :-1]) & valid[:, 1:]
        if rising.any():
            d = int(np.nonzero(rising.any(axis=1))[0][0])
            raise CandidateError(
                f"DepthTable row {d} log-probs must be non-increasing (top-k order), "
                f"got {lp[d][valid[d]].tolist()}")
        counts = valid.sum(axis=1)
        self.tokens = tok
        self.logprobs = np.ascontiguousarray(np.where(valid, lp, -np.inf))
        self.valid = counts.astype(np.int64)
        self.rho = as_ngram_signal(rho)
        if entropy is not None:
            ent = np.asarray(entropy, dtype=np.float64)
            if ent.shape != (tok.shape[0],) or not np.all(np.isfinite(ent)) or np.any(ent < 0):
                raise CandidateError(
                    f"DepthTable entropy must be [depth] finite >= 0, got {ent.tolist()}")
            entropy = ent
        self.entropy = entropy

    @classmethod
    def from_logprobs(cls, logprobs, k: int, root: int, context: Sequence[int] = (), rho=None,
                      ) -> "DepthTable":
        """Top-k of full-vocabulary log-probs [D, V] (numpy or torch); keeps the exact entropy."""
        lp = np.asarray(logprobs.detach().cpu() if hasattr(logprobs, "detach") else logprobs,
                        dtype=np.float64)
        if lp.ndim != 2:
            raise CandidateError(f"logprobs must be [depth, vocab], got shape {lp.shape}")
        k = min(int(k), lp.shape[1])
        top = np.argsort(-lp, axis=1, kind="stable")[:, :k]
        p = np.exp(lp)
        ent = -np.sum(np.where(p > 0, p * lp, 0.0), axis=1)
        return cls(top, np.take_along_axis(lp, top, axis=1), root, context, rho, np.maximum(ent, 0))

    @property
    def depth(self) -> int:
        return int(self.tokens.shape[0])

    @property
    def k(self) -> int:
        return int(self.tokens.shape[1])

    def entropies(self) -> np.ndarray:
        """Entropy per depth: the given full-vocabulary one, or the top-k lower bound."""
        if self.entropy is not None:
            return self.entropy
        p = np.exp(self.logprobs)  # exp(-inf) = 0 on padding
        return -np.sum(np.where(p > 0, p * np.where(p > 0, self.logprobs, 0.0), 0.0), axis=1)


class Expander:
    """Wraps a batched child generator ``fn(paths, k) -> (tokens [n, k], logprobs [n, k])``.

    ``paths`` are tuples of draft tokens after the root (``()`` = the root). Rows may be padded
    with -1; duplicates in a row are dropped (first kept) and rows are ordered by log-prob,
    highest first (ties keep the drafter's order), so rank 0 is the top-1 child.
    """

    __slots__ = ("fn", "root", "context", "rho", "calls")

    def __init__(self, fn: Callable, root: int, context: Sequence[int] = (), rho=None):
        if not callable(fn):
            raise CandidateError(f"Expander needs a callable, got {type(fn).__name__}")
        self.fn = fn
        self.root, self.context = _check_root(root, context)
        self.rho = as_ngram_signal(rho)
        self.calls = 0

    def expand(self, paths: list[tuple[int, ...]], k: int
               ) -> list[tuple[np.ndarray, np.ndarray]]:
        """Cleaned children per path: (tokens int64[m], logprobs float64[m]), m <= k."""
        if not paths:
            return []
        self.calls += 1
        tok, lp = self.fn(paths, k)
        return clean_children(tok, lp, len(paths), k)


def clean_children(tokens, logprobs, n_paths: int, k: int, *, keep_order: bool = False
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Validate and clean one batch of raw expander output for `n_paths` paths asked for `k`.

    ``tokens`` int [n_paths, <= k] and ``logprobs`` [n_paths, <= k] (numpy, torch on any device,
    or nested lists): per path its children's token ids, -1 padding anywhere. Per row, -1 entries
    and repeated tokens (first kept) are dropped, the rest ordered by log-prob, highest first
    (ties keep the given order), so rank 0 is the top-1 child; with ``keep_order`` the given order
    is kept (sampled children in draw order, tree/sampled.py). Raises `CandidateError` on a wrong
    shape or a kept log-prob that is not finite and <= 0. This is the one cleaning step every
    expansion goes through (`Expander.expand`, `vllm_treespec.tree.lockstep.run_lockstep`).

    Example:
        >>> [(t.tolist(), l.tolist()) for t, l in clean_children([[5, -1, 7, 5]],
        ...                                                      [[-2., 0., -1., -.5]], 1, 4)]
        [([7, 5], [-1.0, -2.0])]
    """
    tok = np.asarray(tokens.cpu() if hasattr(tokens, "cpu") else tokens)
    lp = np.asarray(logprobs.cpu() if hasattr(logprobs, "cpu") else logprobs, dtype=np.float64)
    if tok.ndim != 2 or tok.shape[0] != n_paths or tok.shape[1] > k or lp.shape != tok.shape:
        raise CandidateError(
            f"expander returned tokens {tok.shape} / logprobs {lp.shape}; expected "
            f"[{n_paths}, <= {k}] each")
    out = []
    for row_t, row_l in zip(tok.astype(np.int64).tolist(), lp.tolist()):
        seen: set[int] = set()
        keep = []
        for j, (t, l) in enumerate(zip(row_t, row_l)):
            if t < 0 or t in seen:
                continue
            if not math.isfinite(l) or l > 1e-6:
                raise CandidateError(f"expander log-prob {l} for token {t} is not finite <= 0")
            seen.add(t)
            keep.append((-l, j, t, l))
        if not keep_order:
            keep.sort()
        out.append((np.array([x[2] for x in keep], dtype=np.int64),
                    np.array([x[3] for x in keep], dtype=np.float64)))
    return out
