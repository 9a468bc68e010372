"""Triton greedy tree acceptance is exactly the torch greedy rule of tests/support/greedy_reference.py
(CPU: interpreter).

Logits are biased so that the target's argmax usually is one of the current node's children:
paths then run deep (down to whole 256-node chains), not just root + bonus.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.triton_mode import triton_mode_problem
from support.greedy_reference import accept_greedy
from support.kernel_cases import poison_
from support.verify_cases import biased_logits, random_tree_batch
from vllm_treespec.verify.sampling_params import greedy_tokens

if (_why := triton_mode_problem()) is not None:
    pytest.skip(_why, allow_module_level=True)

from vllm_treespec.kernels.tree_accept import greedy_tree_accept  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _tree(rng, sizes, vocab, max_children):
    return random_tree_batch(rng, sizes, vocab, max_children=max_children)


@pytest.mark.parametrize("seed,sizes,vocab,max_children", [
    (0, [1, 2, 5, 17, 64, 3], 16, 4),          # root-only and small trees, wide fan-out
    (1, [256, 100, 1, 31], 32, 2),             # 256 nodes: BLOCK_N 256
    (2, [256, 256], 8, 1),                     # chains: paths of up to 255 drafts
    (3, list(range(1, 40)), 6, 3),             # many requests
])
def test_matches_torch_greedy_rule(seed, sizes, vocab, max_children):
    rng = np.random.default_rng(seed)
    for follow in (0.3, 0.95):
        tree = _tree(rng, sizes, vocab, max_children)
        logits = biased_logits(rng, tree, vocab, follow, boost=10.0)
        want = accept_greedy(tree, logits)
        width = want.emitted.shape[1]
        dev = tree.to(DEVICE)
        got = greedy_tree_accept(dev.offsets, dev.tokens, dev.parents,
                                 greedy_tokens(logits).to(DEVICE), width)
        assert torch.equal(got[0].cpu(), want.emitted)
        assert torch.equal(got[1].cpu(), want.accepted_nodes)
        assert torch.equal(got[2].cpu(), want.num_emitted)
        if follow > 0.9:
            assert int(want.num_emitted.max()) >= 3        # paths past the first level


def test_int32_inputs_and_width_cut():
    """int32 arrays work; a narrower width keeps the first `width` tokens of the walk, like
    csrc/verify/greedy_walk.cpp."""
    rng = np.random.default_rng(4)
    tree = _tree(rng, [40, 12, 1], 4, 2)
    logits = biased_logits(rng, tree, 4, 1.0, boost=10.0)
    full = accept_greedy(tree, logits)
    i32 = {k: getattr(tree, k).to(torch.int32).to(DEVICE) for k in ("offsets", "tokens", "parents")}
    target = greedy_tokens(logits).to(torch.int32).to(DEVICE)
    for width in (1, 2, 3):
        em, nodes, count = (x.cpu() for x in greedy_tree_accept(
            i32["offsets"], i32["tokens"], i32["parents"], target, width, max_nodes=40))
        assert torch.equal(count, full.num_emitted.clamp(max=width))
        keep = torch.arange(width)[None, :] < count[:, None]
        assert torch.equal(em, torch.where(keep, full.emitted[:, :width], -1))
        keep_nodes = torch.arange(width)[None, :] < (count - 1)[:, None]
        assert torch.equal(nodes, torch.where(keep_nodes, full.accepted_nodes[:, :width], -1))


def test_outputs_fully_written():
    """Every output entry is written (buffers come from torch.empty; poison them to check)."""
    rng = np.random.default_rng(5)
    tree = _tree(rng, [9, 1, 20], 5, 3)
    target = greedy_tokens(biased_logits(rng, tree, 5, 0.9, boost=10.0))
    import vllm_treespec.kernels.tree_accept as mod

    real_empty = torch.empty
    try:
        mod.torch.empty = lambda *a, **k: poison_(real_empty(*a, **k))  # type: ignore[assignment]
        em, nodes, count = greedy_tree_accept(tree.offsets.to(DEVICE),
                                              tree.tokens.to(DEVICE),
                                              tree.parents.to(DEVICE), target.to(DEVICE), 6)
    finally:
        mod.torch.empty = real_empty  # type: ignore[assignment]
    assert not (em == -7).any() and not (nodes == -7).any() and not (count == -7).any()
    assert (nodes[:, -1] == -1).all() and (count >= 1).all()
