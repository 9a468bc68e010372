"""DraftTree: validation errors, prefixes, masks and converters agree with the ancestor bitmask."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.random_trees import random_tree
from vllm_treespec.tree import DraftTree, TreeValidationError


def ancestors_by_walking(tree: DraftTree) -> np.ndarray:
    """Obviously-correct dense ancestor-or-self matrix."""
    n = tree.num_nodes
    out = np.zeros((n, n), dtype=bool)
    for i in range(n):
        j = i
        while j >= 0:
            out[i, j] = True
            j = int(tree.parents[j])
    return out


seeds = st.integers(0, 2**32 - 1)
sizes = st.integers(0, 200)


@settings(max_examples=60, deadline=None)
@given(seed=seeds, n=sizes)
def test_masks_and_converters_agree_with_bitmask(seed, n):
    tree = random_tree(np.random.default_rng(seed), n, vocab=8 if n < 20 else 1000,
                       max_children=8 if n < 20 else None)
    anc = ancestors_by_walking(tree)
    words = (n + 1 + 63) // 64
    assert tree.anc_mask.shape == (n + 1, words) and tree.anc_mask.dtype == np.uint64
    for i in range(n + 1):
        for j in range(n + 1):
            bit = (int(tree.anc_mask[i, j // 64]) >> (j % 64)) & 1
            assert bit == anc[i, j]
    assert np.array_equal(tree.dense_mask(), anc)
    # FlashInfer packing: row-major, little bit order, prefix columns all visible.
    for prefix_len in (0, 3):
        full = np.concatenate([np.ones((n + 1, prefix_len), bool), anc], axis=1).reshape(-1)
        packed = tree.packed_mask(prefix_len)
        bits = [(int(packed[b // 8]) >> (b % 8)) & 1 for b in range(full.size)]
        assert bits == full.astype(int).tolist()
    # retrieve_indices: one row per leaf, the root-to-leaf path, -1 padded.
    ri = tree.retrieve_indices()
    leaves = [i for i in range(n + 1) if not anc[:, i].sum() > 1]
    assert ri.shape == (len(leaves), tree.max_depth + 1)
    for row, leaf in zip(ri.tolist(), leaves):
        path = [x for x in row if x >= 0]
        assert path[-1] == leaf and path[0] == 0
        assert row[len(path):] == [-1] * (len(row) - len(path))
        assert sorted(path) == np.nonzero(anc[leaf])[0].tolist()
    assert [tuple(p) for p in tree.paths()] == [tuple(x for x in r if x >= 0) for r in ri.tolist()]
    back = DraftTree.from_retrieve_indices(tree.tokens, ri)
    assert np.array_equal(back.parents, tree.parents) and np.array_equal(back.depth, tree.depth)
    assert tree.draft_token_ids() == tree.tokens[1:].tolist()


@settings(max_examples=60, deadline=None)
@given(seed=seeds, n=sizes, data=st.data())
def test_every_prefix_is_a_valid_tree(seed, n, data):
    tree = random_tree(np.random.default_rng(seed), n)
    m = data.draw(st.integers(0, n))
    cut = tree.prefix(m)
    assert cut.num_draft == m
    DraftTree(cut.tokens, cut.parents, cut.depth, cut.logprob, cut.score)  # full validation
    assert np.array_equal(cut.anc_mask, tree.anc_mask[:m + 1, :(m + 1 + 63) // 64])
    fresh = DraftTree(cut.tokens, cut.parents)
    assert np.array_equal(fresh.anc_mask, cut.anc_mask)


def test_uncut_prefix_is_the_tree_itself():
    """The step planner cuts every verified tree to what was scheduled; uncut, that is no copy."""
    t = DraftTree([1, 2, 3, 4], [-1, 0, 0, 1])
    assert t.prefix(3) is t
    assert t.prefix(2) is not t and t.prefix(2).tokens.tolist() == [1, 2, 3]


def test_prefix_bounds():
    t = DraftTree.chain(1, [2, 3])
    with pytest.raises(ValueError, match=r"0 <= n <= 2"):
        t.prefix(3)
    with pytest.raises(ValueError):
        t.prefix(-1)


@pytest.mark.parametrize("kwargs, match", [
    (dict(tokens=[], parents=[]), "at least the root"),
    (dict(tokens=[1, 2], parents=[-1]), "parents has 1 entries but tokens has 2"),
    (dict(tokens=[1, 2], parents=[0, 0]), r"root \(node 0\) must have parent -1"),
    (dict(tokens=[1, 2], parents=[-1, 0], depth=[1, 2]), r"root \(node 0\) must have depth 0"),
    (dict(tokens=[1, -2], parents=[-1, 0]), "node 1 has negative token id -2"),
    (dict(tokens=[1, 2, 3], parents=[-1, 0, 5]), "node 2 has parent 5, out of range 0..2"),
    (dict(tokens=[1, 2, 3], parents=[-1, 0, -4]), "node 2 has parent -4, out of range"),
    (dict(tokens=[1, 2, 3], parents=[-1, -1, 0]), "node 1 has parent -1: only node 0"),
    (dict(tokens=[1, 2, 3], parents=[-1, 2, 0]), r"node 1 has parent 2 >= its own index.*cycles"),
    (dict(tokens=[1, 2, 3], parents=[-1, 0, 2]), r"node 2 has parent 2 >= its own index"),
    (dict(tokens=[1, 2, 3], parents=[-1, 0, 1], depth=[0, 1, 1]),
     "node 2 has depth 1 but its parent 1 has depth 1"),
    (dict(tokens=[1, 7, 8, 7], parents=[-1, 0, 0, 0]),
     r"nodes 1 and 3 are siblings \(parent 0\) with the same token 7"),
    (dict(tokens=[1, 2, 3], parents=[-1, 0, 0], logprob=[0, 0]), r"logprob must have shape \(3,\)"),
    (dict(tokens=[[1, 2]], parents=[[-1, 0]]), "tokens must be 1-D"),
    (dict(tokens=[1.5, 2], parents=[-1, 0]), "tokens must hold integers"),
])
def test_validation_errors(kwargs, match):
    with pytest.raises(TreeValidationError, match=match):
        DraftTree(**kwargs)


def test_same_token_under_different_parents_is_fine():
    t = DraftTree([1, 7, 8, 7, 7], [-1, 0, 0, 1, 2])
    assert t.max_depth == 2 and t.leaves().tolist() == [3, 4]


@pytest.mark.parametrize("ri, match", [
    ([[1, 2]], "must start at the root"),
    ([[0, 1, -1, 2]], "after -1 padding"),
    ([[0, 5]], "outside 1..2"),
    ([[0, 1, 2], [0, 2, -1]], "two different parents"),
    ([[0, 1, -1]], "node 2 is on no retrieve_indices row"),
])
def test_from_retrieve_indices_errors(ri, match):
    with pytest.raises(TreeValidationError, match=match):
        DraftTree.from_retrieve_indices([5, 6, 7], np.array(ri))


def test_helpers():
    t = DraftTree([5, 7, 8, 9], [-1, 0, 0, 1])
    assert t.children() == [[1, 2], [3], [], []]
    assert t.path_tokens(3) == (7, 9)
    assert t.num_words == 1 and len(t) == 4
    assert DraftTree.root_only(3).retrieve_indices().tolist() == [[0]]
    c = DraftTree.chain(1, [2, 3], [-0.5, -0.25])
    assert c.parents.tolist() == [-1, 0, 1] and c.score.tolist() == [0.0, -0.5, -0.75]
    assert t == DraftTree(**{k: v for k, v in t.to_dict().items()})
    assert t != c
