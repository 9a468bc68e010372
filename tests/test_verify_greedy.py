"""Greedy acceptance equals the brute-force longest argmax-matching path: the C++ walk
(verify.greedy_walk on the host), its test-only torch reference, and greedy requests inside a
sampled batch (handed to the greedy walk)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from support.greedy_reference import accept_greedy
from support.verify_cases import biased_logits, greedy_reference, random_tree_batch
from vllm_treespec.tree import TreeBatch
from vllm_treespec.verify import SamplingParamsBatch, accept, greedy_walk


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _host_walk(tree, logits, max_depth=None):
    """verify.greedy_walk with accept_greedy's width (deepest node + 1, or max_depth + 1)."""
    width = accept_greedy(tree, logits, max_depth).emitted.shape[1]
    return greedy_walk(tree, logits, width)


GREEDY_RULES = {"walk": _host_walk, "reference": accept_greedy}


def _check_against_reference(tree, logits, res):
    offsets = tree.offsets.tolist()
    width = res.emitted.shape[1]
    for b in range(len(offsets) - 1):
        lo, hi = offsets[b], offsets[b + 1]
        toks = tree.tokens[lo:hi].tolist()
        pars = tree.parents[lo:hi].tolist()
        emitted, path = greedy_reference(toks, pars, logits[lo:hi])
        n = len(emitted)
        assert res.num_emitted[b] == n
        assert res.emitted[b, :n].tolist() == emitted
        assert (res.emitted[b, n:] == -1).all()
        assert res.accepted_nodes[b, : n - 1].tolist() == path
        assert (res.accepted_nodes[b, n - 1 :] == -1).all()
        assert res.accepted_rows[b, : n - 1].tolist() == [lo + v for v in path]
        assert width >= n


@pytest.mark.parametrize("rule", list(GREEDY_RULES))
@pytest.mark.parametrize("vocab", [5, 12, 64])
def test_greedy_matches_brute_force(vocab, rule):
    rng = np.random.default_rng(vocab)
    for _ in range(8):
        sizes = rng.integers(1, 30, size=int(rng.integers(1, 9))).tolist()
        tree = random_tree_batch(rng, sizes, vocab)
        logits = biased_logits(rng, tree, vocab, follow=0.75, boost=5.0)
        res = GREEDY_RULES[rule](tree, logits)
        _check_against_reference(tree, logits, res)


@pytest.mark.parametrize("mode", ["target_only", "rrs"])
def test_temperature_zero_requests_are_greedy_in_stochastic_modes(mode):
    rng = np.random.default_rng(7)
    vocab = 9
    sizes = rng.integers(1, 25, size=12).tolist()
    tree = random_tree_batch(rng, sizes, vocab)
    logits = biased_logits(rng, tree, vocab, follow=0.75, boost=5.0)
    draft = torch.softmax(torch.randn(logits.shape, generator=torch.Generator().manual_seed(0)), -1)
    # Greedy requests mixed with sampled ones; filters set on greedy rows must not matter.
    temps = [0.0 if b % 2 == 0 else 0.9 for b in range(len(sizes))]
    params = SamplingParamsBatch.from_lists(
        temps, top_k=[2] * len(sizes), top_p=[0.5] * len(sizes), min_p=[0.3] * len(sizes)
    )
    res = accept(
        tree, logits, mode=mode, sampling=params, generators=torch.Generator().manual_seed(3),
        draft_probs=draft if mode == "rrs" else None, replacement=False if mode == "rrs" else None,
    )
    ref = accept_greedy(tree, logits)
    greedy_rows = torch.tensor([t == 0.0 for t in temps])
    assert torch.equal(res.emitted[greedy_rows], ref.emitted[greedy_rows])
    assert torch.equal(res.accepted_nodes[greedy_rows], ref.accepted_nodes[greedy_rows])


@pytest.mark.parametrize("rule", list(GREEDY_RULES))
def test_greedy_ties_take_first_index_and_low_precision_logits(rule):
    # Root row ties between tokens 3 and 1: argmax picks 1 (first index), which is a child.
    tree = TreeBatch.from_arrays([0, 3], [0, 3, 1], [-1, 0, 0])
    logits = torch.zeros(3, 6, dtype=torch.bfloat16)
    logits[0, 3] = logits[0, 1] = 2.0
    logits[2, 4] = 1.0
    res = GREEDY_RULES[rule](tree, logits)
    assert res.emitted.tolist() == [[1, 4]]
    assert res.accepted_nodes.tolist() == [[2, -1]]


@pytest.mark.parametrize("rule", list(GREEDY_RULES))
def test_root_only_requests_emit_one_bonus_token_and_padding(rule):
    tree = TreeBatch.from_arrays([0, 1, 4, 5], [9, 9, 2, 3, 9], [-1, -1, 0, 1, -1])
    logits = torch.full((5, 6), -1.0)
    logits[0, 5] = 1.0  # request 0: bonus 5
    logits[1, 2] = logits[2, 3] = logits[3, 0] = 1.0  # request 1: path 2, 3 then bonus 0
    logits[4, 4] = 1.0
    res = GREEDY_RULES[rule](tree, logits, max_depth=4)
    assert res.emitted.tolist() == [[5, -1, -1, -1, -1], [2, 3, 0, -1, -1], [4, -1, -1, -1, -1]]
    assert res.num_emitted.tolist() == [1, 3, 1]
    assert res.num_accepted.tolist() == [0, 2, 0]
    assert res.accepted_nodes.tolist()[1] == [1, 2, -1, -1, -1]
    assert res.accepted_rows.tolist()[1] == [2, 3, -1, -1, -1]


def test_greedy_is_not_a_mode_of_accept():
    """accept() holds the sampled rules only; the greedy rule is the greedy walk."""
    tree = TreeBatch.root_only([3])
    with pytest.raises(ValueError, match="greedy_walk"):
        accept(tree, torch.randn(1, 5), mode="greedy")
