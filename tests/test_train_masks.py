"""Training masks (train/masks.py) equal the DART paper's three-part mask (App. B, ported
pointwise below as the reference) on small cases, and one block of the training mask is exactly
the serving mask (no train/serve skew in what a head attends)."""
from __future__ import annotations

import pytest
import torch

from vllm_treespec.train.masks import (additive_mask, block_positions, prefix_shared_mask,
                                       serving_mask)


def _paper_mask(q_idx, kv_idx, seq_len, prompt_len, draft_len):
    """App. B's generate_dart_mask, one (q, kv) pair at a time."""
    prompt_causal = (q_idx < prompt_len and kv_idx < prompt_len and q_idx >= kv_idx
                     and q_idx < seq_len and kv_idx < seq_len)
    group = (q_idx - prompt_len) // draft_len
    view_prompt = (q_idx >= prompt_len and kv_idx < prompt_len and group < seq_len
                   and kv_idx <= group)
    k_group = (kv_idx - prompt_len) // draft_len
    internal = (q_idx >= prompt_len and kv_idx >= prompt_len and group == k_group
                and q_idx >= kv_idx and group < seq_len)
    return prompt_causal or view_prompt or internal


@pytest.mark.parametrize("prompt_len,block_len,valid", [(3, 2, 3), (4, 3, 4), (5, 7, 3), (2, 1, 0)])
def test_prefix_shared_mask_equals_the_paper(prompt_len, block_len, valid):
    mask = prefix_shared_mask(prompt_len, block_len, valid_len=valid)
    q = prompt_len * (block_len + 1)
    want = torch.tensor([[_paper_mask(a, b, valid, prompt_len, block_len) for b in range(q)]
                         for a in range(q)])
    assert torch.equal(mask, want)


@pytest.mark.parametrize("within", ["causal", "bidirectional"])
def test_each_block_of_the_training_mask_is_the_serving_mask(within):
    p, m = 5, 3
    mask = prefix_shared_mask(p, m, within_block=within)
    pos = block_positions(p, m)
    for g in range(p):
        rows = list(range(g + 1)) + [p + g * m + j for j in range(m)]
        cut = mask[rows][:, rows]
        assert torch.equal(cut, serving_mask(g + 1, m, within_block=within)), g
        # nothing outside its own prefix and block is visible to the block
        block = mask[p + g * m: p + (g + 1) * m]
        assert block.sum() == cut[g + 1:].sum()
        assert pos[rows].tolist() == list(range(g + 1 + m))        # positions continue the prefix


def test_bidirectional_only_changes_within_block():
    causal, bi = prefix_shared_mask(4, 3), prefix_shared_mask(4, 3, within_block="bidirectional")
    diff = (causal ^ bi).nonzero().tolist()
    assert diff and all(a >= 4 and b >= 4 and (a - 4) // 3 == (b - 4) // 3 and b > a for a, b in diff)


def test_additive_mask_keeps_padding_rows_finite():
    mask = prefix_shared_mask(3, 2, valid_len=2)
    add = additive_mask(mask)
    assert torch.isfinite(torch.softmax(add, -1)).all()
    assert (add[mask] == 0).all() and torch.isinf(add[~mask & mask.any(1, keepdim=True)]).all()


@pytest.mark.parametrize("kwargs,match", [
    (dict(prompt_len=0, block_len=2), "prompt_len and block_len"),
    (dict(prompt_len=3, block_len=2, valid_len=4), "valid_len"),
    (dict(prompt_len=3, block_len=2, within_block="full"), "within_block"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        prefix_shared_mask(**kwargs)
