"""Training attention masks of parallel draft heads, as boolean [Q, K] matrices (True = attend).

DART's prefix-shared masked training (paper 000, section 3.3 and App. B) lays one sequence out as
``P`` clean prefix rows followed by ``P`` blocks of ``m`` mask rows, block g standing for "predict
the m tokens after prefix position g". Its mask is the union of three parts:

1. prompt causal: clean rows attend causally among clean rows;
2. mask to own prefix: every row of block g attends clean rows 0..g (only its prefix);
3. within block: rows of the same block attend each other causally (DART, JetSpec's
   block-causal heads) or in both directions (``within_block="bidirectional"``: the
   DFlash/diffusion-style comparison head).

Blocks never see each other, and padding (rows at or past ``valid_len``, blocks of groups at or
past it) attends nothing and is attended by nothing. At serving time the same head sees one
prefix and one block: `serving_mask` is the square mask of that layout, and
`tests/test_train_masks.py` checks that cutting the training mask down to one block's rows gives
exactly it, so training and serving see the same context.
"""
from __future__ import annotations

from typing import Literal

import torch

__all__ = ["prefix_shared_mask", "serving_mask", "block_positions", "additive_mask"]

WithinBlock = Literal["causal", "bidirectional"]


def _check(prompt_len: int, block_len: int, valid_len: int | None) -> int:
    if prompt_len < 1 or block_len < 1:
        raise ValueError(f"prompt_len and block_len must be >= 1, got {prompt_len}, {block_len}")
    valid = prompt_len if valid_len is None else int(valid_len)
    if not 0 <= valid <= prompt_len:
        raise ValueError(f"valid_len must be in [0, prompt_len={prompt_len}], got {valid_len}")
    return valid


def prefix_shared_mask(prompt_len: int, block_len: int, *, valid_len: int | None = None,
                       within_block: WithinBlock = "causal") -> torch.Tensor:
    """bool [Q, Q], Q = prompt_len * (block_len + 1): the three-part mask (module docstring).

    Rows 0..P-1 are the clean prefix, then block g (g = 0..P-1) occupies rows
    P + g*m .. P + (g+1)*m - 1. ``valid_len`` is the sequence's unpadded length (<= P).
    """
    valid = _check(prompt_len, block_len, valid_len)
    p, m = prompt_len, block_len
    q = p * (m + 1)
    idx = torch.arange(q)
    is_clean = idx < p
    group = torch.where(is_clean, idx, (idx - p) // m)       # clean row i: its own position
    qi, ki = idx[:, None], idx[None, :]
    qg, kg = group[:, None], group[None, :]
    q_clean, k_clean = is_clean[:, None], is_clean[None, :]
    prompt_causal = q_clean & k_clean & (qi >= ki)
    own_prefix = ~q_clean & k_clean & (ki <= qg)
    same_block = ~q_clean & ~k_clean & (qg == kg)
    if within_block == "causal":
        same_block &= qi >= ki
    elif within_block != "bidirectional":
        raise ValueError(f"within_block must be 'causal' or 'bidirectional', got {within_block!r}")
    live = group < valid                                    # padding rows and padded groups
    return (prompt_causal | own_prefix | same_block) & live[:, None] & live[None, :]


def serving_mask(prefix_len: int, block_len: int, *,
                 within_block: WithinBlock = "causal") -> torch.Tensor:
    """bool [n + m, n + m] for one prefix of n clean rows followed by one block of m mask rows."""
    n, m = int(prefix_len), int(block_len)
    if n < 1 or m < 0:
        raise ValueError(f"prefix_len must be >= 1 and block_len >= 0, got {prefix_len}, {block_len}")
    size = n + m
    idx = torch.arange(size)
    qi, ki = idx[:, None], idx[None, :]
    mask = qi >= ki
    if within_block == "bidirectional":
        mask |= (qi >= n) & (ki >= n)
    elif within_block != "causal":
        raise ValueError(f"within_block must be 'causal' or 'bidirectional', got {within_block!r}")
    return mask


def block_positions(prompt_len: int, block_len: int) -> torch.Tensor:
    """int64 [Q] RoPE positions of the prefix-shared layout: clean row i at i, row j of block g at
    g + 1 + j (the positions that block's tokens would have after prefix 0..g)."""
    p, m = prompt_len, block_len
    blocks = torch.arange(p)[:, None] + 1 + torch.arange(m)[None, :]
    return torch.cat([torch.arange(p), blocks.reshape(-1)])


def additive_mask(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """0 where ``mask`` is True, -inf elsewhere (SDPA's float mask). Rows that attend nothing
    (padding) get 0 everywhere instead, so their softmax stays finite; their outputs are
    ignored by the loss."""
    out = torch.zeros(mask.shape, dtype=dtype)
    out.masked_fill_(~mask, float("-inf"))
    dead = ~mask.any(dim=-1)
    out[dead] = 0.0
    return out
