"""TreeBatch: the flat layout (offsets, local parents, local ancestor words) round-trips."""
from __future__ import annotations

import numpy as np
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
    assert b.logprob.dtype == torch.float32 and b.score.dtype == torch.float32
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
        assert b.tree(i) == tree
        assert np.array_equal(b.tree(i).anc_mask, tree.anc_mask)
    assert b.to_trees() == trees
    assert b.to("cpu").tokens.tolist() == b.tokens.tolist()


def test_high_bit_survives_int64_view():
    tree = DraftTree.chain(1, list(range(2, 66)))  # 65 nodes: node 63 sets bit 63 of word 0
    b = TreeBatch.from_trees([tree])
    assert b.anc_mask[63, 0].item() < 0  # two's-complement view of bit 63
    assert b.tree(0).anc_mask[64].tolist() == [2**64 - 1, 1]


def test_empty_batch():
    b = TreeBatch.from_trees([])
    assert b.batch_size == 0 and b.num_rows == 0 and b.offsets.tolist() == [0]
