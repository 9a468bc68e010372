"""Shadow probes (budget/shadow.py): a probe tree walked with the tokens its request samples next
accepts the path a verification by the target-only rule would, and is settled only once those
tokens decide it."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_treespec.budget.shadow import ShadowProbe
from vllm_treespec.tree import DraftTree

# root 7 -> 1 -> 2 (a chain of two), and root -> 5 (a second child at depth 1)
TREE = DraftTree([7, 1, 5, 2], [-1, 0, 0, 1])


@pytest.mark.parametrize("tokens, expected", [
    ([1, 2], (2, 2)),          # the whole chain, to its leaf
    ([1, 2, 9], (2, 2)),       # tokens past a leaf change nothing
    ([5], (2, 1)),             # the other child: a leaf at depth 1, short of the deepest node
    ([1, 3], (2, 1)),          # the second token matches no child
    ([4], (2, 0)),             # nothing accepted
])
def test_the_walk_follows_the_sampled_tokens(tokens, expected):
    assert ShadowProbe(TREE, start=10).settle(tokens) == expected


def test_an_undecided_walk_waits_for_more_tokens_and_resumes_where_it_stopped():
    probe = ShadowProbe(TREE, start=10)
    assert probe.settle([]) is None
    assert probe.settle([1]) is None                  # node 1 has a child: not decided yet
    assert probe.settle([1, 2]) == (2, 2)


def test_shadow_acceptance_has_the_target_only_rules_distribution():
    """Verified by the target-only rule, a node's child is accepted when the token drawn from
    the target's p carries it; a shadow probe sees the token plain decoding draws from the same
    p. Over many draws from one p both accept each depth-1 child at its probability."""
    from vllm_treespec.verify.accept import accept_target_only
    from vllm_treespec.verify.sampling_params import SamplingParamsBatch
    from vllm_treespec.tree import TreeBatch

    draws = 4000
    logits = torch.log(torch.tensor([0.05, 0.4, 0.05, 0.05, 0.05, 0.3, 0.05, 0.05]))
    tree = DraftTree([7, 1, 5], [-1, 0, 0])          # two children at depth 1: p 0.4 and 0.3
    gen = torch.Generator().manual_seed(0)
    batch = TreeBatch.from_trees([tree] * draws)
    rows = logits.repeat(3 * draws, 1)
    verified = accept_target_only(batch, rows, SamplingParamsBatch.random(draws), gen)
    verified_accepts = (verified.num_emitted - 1).float().mean().item()
    sampled = torch.multinomial(torch.softmax(logits, -1), draws, replacement=True, generator=gen)
    shadow_accepts = np.mean([ShadowProbe(tree, 0).settle([int(t)])[1] for t in sampled])
    # both estimate 0.7 = p(1) + p(5); 4000 draws: standard error 0.0072 each
    assert abs(verified_accepts - 0.7) < 0.03 and abs(shadow_accepts - 0.7) < 0.03
    assert abs(verified_accepts - shadow_accepts) < 0.04
