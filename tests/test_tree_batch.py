"""TreeBatch, the step's one tree contract: the flat layout (offsets, local parents, local
ancestor words, children) round-trips, derived tables agree with the trees, `check` names what
breaks the contract, `gather` re-lays trees beside root-only entries."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.random_trees import random_tree
from vllm_treespec.tree import DraftTree, TreeBatch


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), sizes=st.lists(st.integers(0, 150), min_size=0, max_size=6))
def test_round_trip_and_format(seed, sizes):
    rng = np.random.default_rng(seed)
    trees = [random_tree(rng, n) for n in sizes]
    b = TreeBatch.from_trees(trees)
    assert b.batch_size == len(trees)
    assert b.offsets.dtype == torch.int64 and b.offsets.tolist()[0] == 0
    assert b.offsets.tolist() == np.concatenate([[0], np.cumsum([n + 1 for n in sizes])]).tolist()
    for name in ("tokens", "parents", "depth"):
        assert getattr(b, name).dtype == torch.int64
    assert b.anc_mask.dtype == torch.int64
    words = max([(n + 1 + 63) // 64 for n in sizes], default=1)
    assert tuple(b.anc_mask.shape) == (b.num_rows, words)
    assert b.max_depth == max([t.max_depth for t in trees], default=0)
    for i, tree in enumerate(trees):
        rows = b.request_rows(i)
        assert b.parents[rows.start] == -1  # root first
        assert b.tokens[rows].tolist() == tree.tokens.tolist()
        assert b.parents[rows].tolist() == tree.parents.tolist()  # local indices
        mask = b.anc_mask[rows].numpy().view(np.uint64)
        assert np.array_equal(mask[:, :tree.num_words], tree.anc_mask)
        assert not mask[:, tree.num_words:].any()
        back = b.tree(i)
        assert back.tokens.tolist() == tree.tokens.tolist() and back.depth.tolist() == tree.depth.tolist()
        assert np.array_equal(back.anc_mask, tree.anc_mask)
        children = tree.children()
        for node in range(tree.num_nodes):
            row = rows.start + node
            assert int(b.num_children[row]) == len(children[node])
            assert [r - rows.start for r in b.children[row].tolist() if r >= 0] == children[node]
        assert b.request_of_row[rows].tolist() == [i] * tree.num_nodes
        assert b.local[rows].tolist() == list(range(tree.num_nodes))
    assert [t.parents.tolist() for t in b.to_trees()] == [t.parents.tolist() for t in trees]
    if trees:
        assert b.check(vocab_size=1 << 20) is b
    assert b.to("cpu").tokens.tolist() == b.tokens.tolist()


def test_high_bit_survives_int64_view():
    tree = DraftTree.chain(1, list(range(2, 66)))  # 65 nodes: node 63 sets bit 63 of word 0
    b = TreeBatch.from_trees([tree])
    assert b.anc_mask[63, 0].item() < 0  # two's-complement view of bit 63
    assert b.tree(0).anc_mask[64].tolist() == [2**64 - 1, 1]


def test_empty_batch():
    b = TreeBatch.from_trees([])
    assert b.batch_size == 0 and b.num_rows == 0 and b.offsets.tolist() == [0]


def test_from_arrays_derives_depth_and_root_only():
    b = TreeBatch.from_arrays([0, 4, 5], [5, 1, 2, 3, 9], [-1, 0, 0, 1, -1])
    assert b.depth.tolist() == [0, 1, 1, 2, 0] and b.max_depth == 2
    r = TreeBatch.root_only([4, 6])
    assert r.is_root_only and r.offsets.tolist() == [0, 1, 2] and r.parents.tolist() == [-1, -1]
    assert not b.is_root_only


@pytest.mark.parametrize("arrays, message", [
    (([0, 3], [5, 1, 2], [-1, 0, 2], None), "invalid parent 2 at request 0, node 2"),
    (([0, 3], [5, 1, 1], [-1, 0, 0], None), "two children with token 1"),
    (([0, 2], [5, 99], [-1, 0], None), "token 99 at request 0, node 1 is outside the vocabulary"),
    (([0, 2], [5, 1], [-1, 0], [0, 2]), "depth disagrees with parents"),
    (([0, 0, 2], [5, 1], [-1, 0], None), "request 0 owns 0 rows"),
    (([0, 3], [5, 1], [-1, 0], None), "end at the number of rows"),
])
def test_check_names_what_breaks_the_contract(arrays, message):
    with pytest.raises(ValueError, match=message):
        TreeBatch.from_arrays(*arrays).check(vocab_size=16)


def test_gather_puts_root_only_trees_beside_the_batch_trees():
    a, c = DraftTree([5, 7, 8], [-1, 0, 0]), DraftTree.chain(3, [4])
    b = TreeBatch.from_trees([a, c])
    got, src = b.gather(np.array([1, -1, 0]))
    assert got.offsets.tolist() == [0, 2, 3, 6]
    assert got.tokens.tolist() == [3, 4, 0, 5, 7, 8]
    assert got.parents.tolist() == [-1, 0, -1, -1, 0, 0] and got.depth.tolist() == [0, 1, 0, 0, 1, 1]
    assert src.tolist() == [3, 4, -1, 0, 1, 2]
    got.check()


def test_device_twin_is_made_once_in_one_copy():
    b = TreeBatch.from_trees([DraftTree([5, 7, 8], [-1, 0, 0]), DraftTree.chain(3, [4])])
    assert b.to("cpu") is b
    b.anc_mask                                    # built before the move: travels with the twin
    twin = b.to("meta")
    assert twin is b.to(torch.device("meta"))
    assert twin.device.type == "meta" and twin.offsets.shape == b.offsets.shape
    assert twin.depth.shape == b.depth.shape and twin.anc_mask.device.type == "meta"
