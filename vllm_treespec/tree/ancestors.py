"""Ancestor-or-self bitmask words of flat trees: the one implementation every mask comes from
(DraftTree.anc_mask, TreeBatch, the engine's step plan and so every attention kernel).

Row r (node i of its tree) holds bit j (word j // 64, bit j % 64) iff local node j of the same
tree is i's ancestor or i itself. Nodes must come after their parents (DraftTree's order).
"""
from __future__ import annotations

import numpy as np

__all__ = ["ancestor_words", "local_index"]


def local_index(sizes: np.ndarray) -> np.ndarray:
    """int64 [sum(sizes)]: each flat row's index within its own block, for blocks of `sizes`
    rows laid end to end (a tree's nodes, a request's rows)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    if sizes.size == 1:
        return np.arange(int(sizes[0]), dtype=np.int64)
    return np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)


def ancestor_words(offsets: np.ndarray, parents: np.ndarray, depth: np.ndarray) -> np.ndarray:
    """uint64 [T, W] local ancestor-or-self words of the flat trees `offsets` [B+1] delimits
    (parents local, -1 at roots; depth per node); W = words of the largest tree. One vectorised
    pass per tree level over all trees at once."""
    offsets = np.asarray(offsets, dtype=np.int64)
    sizes = offsets[1:] - offsets[:-1]
    t = int(offsets[-1])
    words = int((sizes.max() + 63) // 64) if sizes.size else 0
    anc = np.zeros((t, words), dtype=np.uint64)
    if t == 0:
        return anc
    local = local_index(sizes)
    anc[np.arange(t), local >> 6] = np.left_shift(np.uint64(1), (local & 63).astype(np.uint64))
    gparent = np.where(parents >= 0, parents + np.repeat(offsets[:-1], sizes), -1)
    for d in range(1, int(np.max(depth)) + 1):
        rows = np.nonzero(depth == d)[0]
        anc[rows] |= anc[gparent[rows]]
    return anc
