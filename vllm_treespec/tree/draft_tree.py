"""DraftTree: one request's draft tree for one step (docs/design.md section 2).

Node 0 is the root, the last token already sampled (the first query token of a speculative
request). Draft nodes 1..N follow in topological order (``parents[i] < i``), so every prefix of
the node list is itself a valid tree: vLLM's scheduler may cut a request's drafts to a prefix and
the tree stays consistent. Siblings carry distinct tokens, so a target token selects at most one
child (what greedy and top-k acceptance need).

Arrays (numpy, length N+1): ``tokens`` int64, ``parents`` int64 (-1 at the root), ``depth`` int64
(0 at the root), ``logprob`` float32 (the drafter's log-prob of the node's token given its path;
0 at the root), ``score`` float32 (the builder's cumulative score; 0 at the root) and, where the
drafter says what rated each node, ``source`` int8 (a drafter-defined class, 0 at the root; None
otherwise: every node class 0), so that a calibration of the ratings can keep one curve per
source (budget/confidence.py). The
ancestor-or-self bitmask ``anc_mask`` is uint64 ``[N+1, ceil((N+1)/64)]``: bit j of row i (word
j // 64, bit j % 64) is set iff node j is node i or one of its ancestors. It is computed lazily,
because builders run every step and most callers only need tokens and parents.

Example:
    >>> t = DraftTree(tokens=[5, 7, 8, 9], parents=[-1, 0, 0, 1])
    >>> t.draft_token_ids()
    [7, 8, 9]
    >>> t.paths()
    [(0, 2), (0, 1, 3)]
    >>> t.retrieve_indices().tolist()
    [[0, 2, -1], [0, 1, 3]]
    >>> t.prefix(1).num_draft
    1
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from vllm_treespec.tree.ancestors import ancestor_words

__all__ = ["DraftTree", "TreeValidationError"]


class TreeValidationError(ValueError):
    """A DraftTree's arrays break one of the tree rules; the message names node and rule."""


def _as_int64(name: str, values) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise TreeValidationError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        if not np.all(np.isfinite(arr)) or not np.all(arr == np.round(arr)):
            raise TreeValidationError(f"{name} must hold integers, got dtype {arr.dtype}")
    return np.ascontiguousarray(arr, dtype=np.int64)


class DraftTree:
    """One request's draft tree; see the module docstring for the layout and rules."""

    __slots__ = ("tokens", "parents", "depth", "logprob", "score", "source", "_anc")

    def __init__(self, tokens: Sequence[int] | np.ndarray, parents: Sequence[int] | np.ndarray,
                 depth: Sequence[int] | np.ndarray | None = None,
                 logprob: Sequence[float] | np.ndarray | None = None,
                 score: Sequence[float] | np.ndarray | None = None, *, validate: bool = True,
                 source: Sequence[int] | np.ndarray | None = None):
        if not validate:  # builders: arrays already have the right dtypes and shapes
            self.tokens, self.parents, self.depth = tokens, parents, depth
            self.logprob, self.score, self.source = logprob, score, source
            self._anc = None
            return
        self.tokens = _as_int64("tokens", tokens)
        self.parents = _as_int64("parents", parents)
        n = self.tokens.shape[0]
        if n == 0:
            raise TreeValidationError("a tree needs at least the root node (tokens is empty)")
        if self.parents.shape[0] != n:
            raise TreeValidationError(
                f"parents has {self.parents.shape[0]} entries but tokens has {n}")
        self.depth = (self._depth_from_parents(self.parents) if depth is None
                      else _as_int64("depth", depth))
        self.logprob = self._floats("logprob", logprob, n)
        self.score = self._floats("score", score, n)
        self.source = None
        if source is not None:
            self.source = np.ascontiguousarray(source, dtype=np.int8)
            if self.source.shape != (n,):
                raise TreeValidationError(f"source must have shape ({n},), got {self.source.shape}")
        self._anc = None
        self.validate()

    # ------------------------------------------------------------------ construction helpers
    @staticmethod
    def _floats(name: str, values, n: int) -> np.ndarray:
        if values is None:
            return np.zeros(n, dtype=np.float32)
        arr = np.ascontiguousarray(values, dtype=np.float32)
        if arr.shape != (n,):
            raise TreeValidationError(f"{name} must have shape ({n},), got {arr.shape}")
        return arr

    @staticmethod
    def _depth_from_parents(parents: np.ndarray) -> np.ndarray:
        # Bad parents leave -1 here; validate() then reports the parent rule, which it checks first.
        depth = np.full(parents.shape[0], -1, dtype=np.int64)
        depth[0] = 0
        plist = parents.tolist()
        for i in range(1, len(plist)):
            p = plist[i]
            if 0 <= p < i:
                depth[i] = depth[p] + 1
        return depth

    @classmethod
    def root_only(cls, root: int) -> "DraftTree":
        """The tree with no drafts (plain decoding for this request this step)."""
        return cls([root], [-1])

    @classmethod
    def chain(cls, root: int, tokens: Sequence[int],
              logprobs: Sequence[float] | None = None) -> "DraftTree":
        """A linear draft root -> tokens[0] -> tokens[1] -> ... (what linear drafters give)."""
        n = len(tokens)
        lp = np.zeros(n + 1, dtype=np.float32)
        if logprobs is not None:
            lp[1:] = np.asarray(logprobs, dtype=np.float32)
        toks = np.empty(n + 1, dtype=np.int64)
        toks[0] = root
        toks[1:] = tokens
        if (toks < 0).any():
            raise TreeValidationError(f"token ids must be >= 0, got {toks.tolist()}")
        # the shape is a chain by construction: skip the O(N) structure checks (hot path)
        return cls(toks, np.arange(-1, n, dtype=np.int64), np.arange(n + 1, dtype=np.int64), lp,
                   np.cumsum(lp, dtype=np.float64).astype(np.float32), validate=False)

    @classmethod
    def from_retrieve_indices(cls, tokens: Sequence[int] | np.ndarray,
                              retrieve_indices: np.ndarray) -> "DraftTree":
        """Inverse of `retrieve_indices()`: node tokens plus EAGLE-style root-to-leaf rows."""
        tok = _as_int64("tokens", tokens)
        ri = np.asarray(retrieve_indices, dtype=np.int64)
        if ri.ndim != 2:
            raise TreeValidationError(f"retrieve_indices must be 2-D, got shape {ri.shape}")
        n = tok.shape[0]
        parents = np.full(n, -3, dtype=np.int64)
        depth = np.full(n, -1, dtype=np.int64)
        parents[0], depth[0] = -1, 0
        for r, row in enumerate(ri.tolist()):
            if not row or row[0] != 0:
                raise TreeValidationError(f"retrieve_indices row {r} must start at the root (0)")
            prev, ended = 0, False
            for col, node in enumerate(row[1:], start=1):
                if node == -1:
                    ended = True
                    continue
                if ended:
                    raise TreeValidationError(
                        f"retrieve_indices row {r} has node {node} after -1 padding")
                if not 0 < node < n:
                    raise TreeValidationError(
                        f"retrieve_indices row {r} names node {node}, outside 1..{n - 1}")
                if parents[node] not in (-3, prev) or depth[node] not in (-1, col):
                    raise TreeValidationError(
                        f"node {node} has two different parents in retrieve_indices")
                parents[node], depth[node] = prev, col
                prev = node
        missing = np.nonzero(parents == -3)[0]
        if missing.size:
            raise TreeValidationError(f"node {int(missing[0])} is on no retrieve_indices row")
        return cls(tok, parents, depth)

    # ------------------------------------------------------------------ validation
    def validate(self) -> "DraftTree":
        """Check every tree rule; raise TreeValidationError naming the node and the rule."""
        tok, par, dep = self.tokens, self.parents, self.depth
        n = tok.shape[0]
        for name, arr in (("parents", par), ("depth", dep), ("logprob", self.logprob),
                          ("score", self.score)):
            if arr.shape != (n,):
                raise TreeValidationError(f"{name} must have shape ({n},), got {arr.shape}")
        if n == 0:
            raise TreeValidationError("a tree needs at least the root node (tokens is empty)")
        if par[0] != -1:
            raise TreeValidationError(f"the root (node 0) must have parent -1, got {int(par[0])}")
        if dep[0] != 0:
            raise TreeValidationError(f"the root (node 0) must have depth 0, got {int(dep[0])}")
        bad = np.nonzero(tok < 0)[0]
        if bad.size:
            i = int(bad[0])
            raise TreeValidationError(f"node {i} has negative token id {int(tok[i])}")
        if n == 1:
            return self
        idx = np.arange(1, n)
        p = par[1:]
        bad = np.nonzero((p < -1) | (p >= n))[0]
        if bad.size:
            i = int(bad[0]) + 1
            raise TreeValidationError(
                f"node {i} has parent {int(par[i])}, out of range 0..{n - 1}")
        bad = np.nonzero(p == -1)[0]
        if bad.size:
            raise TreeValidationError(
                f"node {int(bad[0]) + 1} has parent -1: only node 0 may be a root")
        bad = np.nonzero(p >= idx)[0]
        if bad.size:
            i = int(bad[0]) + 1
            raise TreeValidationError(
                f"node {i} has parent {int(par[i])} >= its own index: nodes must be in "
                f"topological order (parents[i] < i), which also rules out cycles")
        bad = np.nonzero(dep[1:] != dep[p] + 1)[0]
        if bad.size:
            i = int(bad[0]) + 1
            raise TreeValidationError(
                f"node {i} has depth {int(dep[i])} but its parent {int(par[i])} has depth "
                f"{int(dep[par[i]])} (must be parent depth + 1)")
        order = np.lexsort((tok[1:], p))
        sp, st = p[order], tok[1:][order]
        dup = np.nonzero((sp[1:] == sp[:-1]) & (st[1:] == st[:-1]))[0]
        if dup.size:
            a, b = sorted((int(order[dup[0]]) + 1, int(order[dup[0] + 1]) + 1))
            raise TreeValidationError(
                f"nodes {a} and {b} are siblings (parent {int(par[a])}) with the same token "
                f"{int(tok[a])}: siblings must carry distinct tokens")
        return self

    # ------------------------------------------------------------------ basic properties
    @property
    def num_nodes(self) -> int:
        """N + 1 (root included)."""
        return int(self.tokens.shape[0])

    @property
    def num_draft(self) -> int:
        """N, the number of draft nodes (what counts against the budget)."""
        return int(self.tokens.shape[0]) - 1

    @property
    def root(self) -> int:
        return int(self.tokens[0])

    @property
    def max_depth(self) -> int:
        return int(self.depth.max())

    @property
    def num_words(self) -> int:
        """64-bit words per ancestor-mask row: ceil((N+1)/64)."""
        return (self.num_nodes + 63) // 64

    def __len__(self) -> int:
        return self.num_nodes

    def __repr__(self) -> str:
        return (f"DraftTree(root={self.root}, num_draft={self.num_draft}, "
                f"max_depth={self.max_depth})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DraftTree):
            return NotImplemented
        return all(np.array_equal(getattr(self, f), getattr(other, f))
                   for f in ("tokens", "parents", "depth", "logprob", "score"))

    __hash__ = None  # mutable arrays

    def draft_token_ids(self) -> list[int]:
        """tokens[1:] as a list: what vLLM's scheduler receives as this request's drafts."""
        return self.tokens[1:].tolist()

    def children(self) -> list[list[int]]:
        """children()[i] = child node indices of node i, in node order."""
        out: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for i, p in enumerate(self.parents[1:].tolist(), start=1):
            out[p].append(i)
        return out

    def leaves(self) -> np.ndarray:
        """Node indices with no children, ascending (the root alone when N = 0)."""
        has_child = np.zeros(self.num_nodes, dtype=bool)
        has_child[self.parents[1:]] = True
        return np.nonzero(~has_child)[0]

    def path_to(self, i: int) -> tuple[int, ...]:
        """Node indices root..i."""
        out = []
        par = self.parents
        while i >= 0:
            out.append(int(i))
            i = int(par[i])
        return tuple(reversed(out))

    def paths(self) -> list[tuple[int, ...]]:
        """Root-to-leaf node-index paths, one per leaf in ascending leaf index."""
        return [self.path_to(int(leaf)) for leaf in self.leaves()]

    def path_tokens(self, i: int) -> tuple[int, ...]:
        """Draft tokens on the path to node i (root token excluded)."""
        return tuple(int(self.tokens[j]) for j in self.path_to(i)[1:])

    # ------------------------------------------------------------------ cutting
    def prefix(self, n: int) -> "DraftTree":
        """The tree cut to the root plus its first n draft nodes (vLLM may cut drafts).

        Valid for any 0 <= n <= N because nodes are in topological order.
        """
        if not isinstance(n, (int, np.integer)) or not 0 <= n <= self.num_draft:
            raise ValueError(f"prefix(n) needs 0 <= n <= {self.num_draft}, got {n!r}")
        m = int(n) + 1
        if m == self.num_nodes:     # uncut (the usual case): trees are never modified in place
            return self
        t = DraftTree(self.tokens[:m].copy(), self.parents[:m].copy(), self.depth[:m].copy(),
                      self.logprob[:m].copy(), self.score[:m].copy(), validate=False,
                      source=None if self.source is None else self.source[:m].copy())
        if self._anc is not None:
            t._anc = np.ascontiguousarray(self._anc[:m, :(m + 63) // 64])
        return t

    # ------------------------------------------------------------------ masks
    @property
    def anc_mask(self) -> np.ndarray:
        """uint64 [N+1, ceil((N+1)/64)] ancestor-or-self bitmask (computed once, cached)."""
        if self._anc is None:
            self._anc = self._compute_anc()
        return self._anc

    def _compute_anc(self) -> np.ndarray:
        return ancestor_words(np.array([0, self.num_nodes]), self.parents, self.depth)

    def dense_mask(self) -> np.ndarray:
        """bool [N+1, N+1]: mask[i, j] iff node j is an ancestor-or-self of node i."""
        n = self.num_nodes
        as_bytes = self.anc_mask.astype("<u8", copy=False).view(np.uint8)
        return np.unpackbits(as_bytes, axis=1, bitorder="little")[:, :n].astype(bool)

    def packed_mask(self, prefix_len: int = 0) -> np.ndarray:
        """FlashInfer-style packed custom mask for this request: uint8, little bit order.

        The bool mask [N+1, prefix_len + N+1] (prefix columns all visible, then the tree part)
        flattened row-major and packed 8 bits per byte, least significant bit first.
        """
        if prefix_len < 0:
            raise ValueError(f"prefix_len must be >= 0, got {prefix_len}")
        dense = self.dense_mask()
        full = np.concatenate([np.ones((dense.shape[0], prefix_len), dtype=bool), dense], axis=1)
        return np.packbits(full.reshape(-1), bitorder="little")

    def retrieve_indices(self) -> np.ndarray:
        """EAGLE-style int64 [num_leaves, max_depth + 1]: node indices root..leaf, -1 padded."""
        leaves = self.leaves()
        out = np.full((leaves.shape[0], self.max_depth + 1), -1, dtype=np.int64)
        for r, leaf in enumerate(leaves.tolist()):
            path = self.path_to(leaf)
            out[r, :len(path)] = path
        return out

    def to_dict(self) -> dict:
        """Plain lists (for logs and JSON)."""
        return {"tokens": self.tokens.tolist(), "parents": self.parents.tolist(),
                "depth": self.depth.tolist(), "logprob": self.logprob.tolist(),
                "score": self.score.tolist(),
                **({} if self.source is None else {"source": self.source.tolist()})}
