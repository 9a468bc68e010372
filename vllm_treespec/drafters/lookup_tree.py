"""Prompt lookup as a tree: merge the continuations of several earlier suffix matches.

The chain drafter (`prompt_lookup.py`) bets on the best match alone. When the request's suffix
occurred several times and what followed differs, `lookup_trees` hedges: the continuations of
the `max_matches` best matches (ranked as `find_suffix_matches` ranks them, with continuations
capped at `max_depth`), keeping only those whose matched suffix is as long as the best one's
(shorter matches are weaker evidence and, counted equally, outranked the best continuation:
tau fell below the chain's on the code-LM fixture), are merged into a trie under the root (the request's last token), each
node weighted by the number of continuations through it, and the `budget` nodes that come first
in the order (weight desc, rank of the best match through the node asc, depth asc) are drafted.

That order puts every parent before its children (weights never grow and the best rank never
improves along a path), so the tree for budget n is the first n nodes of the tree for any larger
budget: vLLM may cut a request's drafts to a prefix and still get the tree it would have built
for that budget. With max_matches=1 the tree is the chain of `propose_chain` (k = max_depth) cut
to the budget. The native core runs over the engine's token buffer without the GIL;
`lookup_trees_reference` is the same semantics in plain Python, for tests.

Per node, ``logprob`` = log(weight / parent weight), the fraction of the parent's matches that
continue with this token (an empirical frequency, not a model probability), and ``score`` =
log(weight / matches used), their sum along the path; both are 0 on a single-match chain.
"""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from vllm_treespec.drafters.base import split_flat_trees
from vllm_treespec.native import native
from vllm_treespec.tree.draft_tree import DraftTree

__all__ = ["lookup_trees", "lookup_trees_reference"]


def _index_array(name: str, values, size: int | None = None) -> np.ndarray:
    """1-D int64 copy of a small per-request array; rejects floats instead of truncating them."""
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integers, got dtype {arr.dtype}")
    if size is not None and arr.shape[0] != size:
        raise ValueError(f"{name} has {arr.shape[0]} entries but rows has {size}")
    return np.ascontiguousarray(arr, dtype=np.int64)


def _check_token_ids(token_ids) -> np.ndarray:
    """The engine buffer as is: converting it would copy [max_reqs, max_len] every step."""
    if not isinstance(token_ids, np.ndarray):
        raise TypeError(f"token_ids must be a numpy array, got {type(token_ids).__name__}")
    if token_ids.dtype != np.int32 or token_ids.ndim != 2:
        raise TypeError(f"token_ids must be a 2-D int32 array [rows, max_len], got "
                        f"{token_ids.ndim}-D {token_ids.dtype}")
    return token_ids


def lookup_trees(token_ids: np.ndarray, rows: Sequence[int] | np.ndarray,
                 num_tokens: Sequence[int] | np.ndarray, budgets: Sequence[int] | np.ndarray, *,
                 min_ngram: int, max_ngram: int, max_matches: int,
                 max_depth: int, continue_prob: float = 1.0) -> list[DraftTree]:
    """One prompt-lookup DraftTree per request (see the module docstring for the semantics).

    continue_prob in (0, 1]: nodes rank by log(weight / matches) + depth * log(continue_prob)
    (1 = by weight alone); below 1, shallow alternatives outrank the majority path's deep tail.

    Request i reads the first num_tokens[i] tokens of token_ids[rows[i]] (nothing after them)
    and gets at most budgets[i] draft nodes; its root is token_ids[rows[i], num_tokens[i] - 1].
    Requests without a match, or with budget 0, get the root-only tree.
    """
    _check_token_ids(token_ids)
    rows = _index_array("rows", rows)
    num_tokens = _index_array("num_tokens", num_tokens, rows.shape[0])
    budgets = _index_array("budgets", budgets, rows.shape[0])
    if rows.shape[0] == 0:
        return []
    tokens, parents, depth, _, logprob, score, counts = native().propose_tree_batch(
        token_ids, rows, num_tokens, budgets, int(min_ngram), int(max_ngram), int(max_matches),
        int(max_depth), float(continue_prob))
    return split_flat_trees(tokens, parents, depth, logprob, score, counts)


# ---------------------------------------------------------------------------- reference
def _reference_matches(tokens: list[int], min_n: int, max_n: int, k: int,
                       max_matches: int) -> list[tuple[int, int]]:
    """(continuation_start, continuation_len) of the best matches: longer match, then longer
    continuation (capped at k), then more recent."""
    n = len(tokens)
    found = []
    for j in range(n - 1):  # the match ends at j, so at least one continuation token exists
        length = 0
        while length < max_n and length <= j and tokens[j - length] == tokens[n - 1 - length]:
            length += 1
        if length >= min_n:
            found.append((length, min(k, n - (j + 1)), j + 1))
    found.sort(key=lambda m: (-m[0], -m[1], -m[2]))
    best = found[:max_matches]
    # only matches of the longest suffix length (see csrc/lookup/lookup_tree.cpp)
    return [(start, cont) for length, cont, start in best if length == best[0][0]]


def _reference_tree(tokens: list[int], budget: int, min_n: int, max_n: int, max_matches: int,
                    max_depth: int, continue_prob: float = 1.0) -> DraftTree:
    root = tokens[-1]
    matches = _reference_matches(tokens, min_n, max_n, max_depth, max_matches)
    weight: dict[tuple[int, ...], int] = {}
    first_rank: dict[tuple[int, ...], int] = {}
    for rank, (start, cont) in enumerate(matches):
        path = tuple(tokens[start:start + cont])
        for d in range(1, len(path) + 1):
            weight[path[:d]] = weight.get(path[:d], 0) + 1
            first_rank.setdefault(path[:d], rank)
    total, log_continue = float(len(matches)), math.log(continue_prob)
    key = {p: math.log(w / total) + len(p) * log_continue for p, w in weight.items()}
    chosen = sorted(weight, key=lambda p: (-key[p], first_rank[p], len(p)))[:budget]
    index = {(): 0}
    node_tokens, node_parents, logprob, score = [root], [-1], [0.0], [0.0]
    for i, path in enumerate(chosen, start=1):
        index[path] = i
        node_tokens.append(path[-1])
        node_parents.append(index[path[:-1]])  # KeyError here = a parent after its child
        parent_weight = weight[path[:-1]] if len(path) > 1 else len(matches)
        logprob.append(math.log(weight[path] / parent_weight))
        score.append(math.log(weight[path] / len(matches)))
    return DraftTree(node_tokens, node_parents, None, logprob, score)


def lookup_trees_reference(token_ids: np.ndarray, rows: Sequence[int], num_tokens: Sequence[int],
                           budgets: Sequence[int], *, min_ngram: int, max_ngram: int,
                           max_matches: int, max_depth: int,
                           continue_prob: float = 1.0) -> list[DraftTree]:
    """Plain-Python `lookup_trees` (a dict trie over token paths), the tests' oracle."""
    return [_reference_tree(token_ids[r, :n].tolist(), int(b), min_ngram, max_ngram, max_matches,
                            max_depth, continue_prob)
            for r, n, b in zip(np.asarray(rows).tolist(), np.asarray(num_tokens).tolist(),
                               np.asarray(budgets).tolist())]
