"""One level of the acceptance walk for a batch of current nodes (one row per request).

All arithmetic is float64 so that probability ratios and residuals of float32 distributions are
exact to far below what a statistical test can see.
"""
from __future__ import annotations

import numpy as np
import torch

from vllm_treespec.verify.sampling_params import (
    SAMPLING_EPS,
    SamplingParamsBatch,
    process_logits,
)


def draw_target_tokens(logits: torch.Tensor, params: SamplingParamsBatch,
                       coins: torch.Tensor, probs: torch.Tensor | None = None) -> torch.Tensor:
    """The token each sampled target row draws with its draw coin, under its own (validated)
    sampling parameters: logits [N, V] raw, params one entry per row (temperature >= 1e-5:
    greedy rows are the greedy walk's), coins float64 [N]. Every walk draws target-only tokens
    here, so a request's tokens do not depend on which walk its batch took. On CPU one native
    pass (csrc/verify/sampled_walk.cpp), elsewhere `draw_target_tokens_torch` on the device;
    probs: the rows' processed float64 target probabilities when the caller has them already
    (a device walk), drawn from directly there instead of processing the rows again."""
    if logits.device.type != "cpu":
        if probs is not None:
            return sample_categorical(probs, coins)
        return draw_target_tokens_torch(logits, params, coins)
    from vllm_treespec.native import native

    return torch.from_numpy(native().sample_target_rows(*native_row_inputs(logits, params),
                                                        coins.contiguous().numpy()))


def draw_target_tokens_torch(logits: torch.Tensor, params: SamplingParamsBatch,
                             coins: torch.Tensor) -> torch.Tensor:
    """draw_target_tokens in torch ops: process_logits, softmax, sample_categorical."""
    probs = torch.softmax(process_logits(logits, params), dim=-1,
                          dtype=torch.float32).to(torch.float64)
    return sample_categorical(probs, coins)


def native_row_inputs(logits: torch.Tensor, params: SamplingParamsBatch,
                      request_of_row: torch.Tensor | None = None) -> tuple[np.ndarray, ...]:
    """(float32 logits, temperature, top_k) as the host arrays the native draws read
    (csrc/verify/sampled_walk.cpp), which apply temperature and top-k themselves. Rows of
    sampled requests with top-p or min-p are processed here by process_logits (top-p's ties then
    break in torch's sort order, as in vLLM's sampler) and handed over at temperature 1 without
    filters. params: one entry per request; request_of_row: the request of each logits row
    (None: row i is request i). Raises on parameters out of range (the caller names them)."""
    top_k_in = torch.as_tensor(params.top_k)
    if top_k_in.dtype.is_floating_point:
        raise TypeError("sampling.top_k must hold integers")
    temperature, top_k = _host(params.temperature, torch.float32), _host(top_k_in, torch.int64)
    top_p, min_p = _host(params.top_p, torch.float32), _host(params.min_p, torch.float32)
    if not ((top_p > 0) & (top_p <= 1) & (min_p >= 0) & (min_p <= 1)).all():
        raise ValueError("sampling.top_p / min_p out of range")
    rows = logits.detach().to(torch.float32)
    in_torch = ((top_p < 1) | (min_p != 0)) & (temperature >= SAMPLING_EPS)
    if in_torch.any():
        request = torch.arange(rows.shape[0]) if request_of_row is None else request_of_row
        index = torch.from_numpy(in_torch)[request].nonzero().squeeze(1)
        rows = rows.clone()
        rows[index] = process_logits(rows[index], params.rows(request[index]))
        temperature, top_k = temperature.copy(), top_k.copy()
        temperature[in_torch] = 1.0
        top_k[in_torch] = 0
    return rows.contiguous().numpy(), temperature, top_k


def _host(values: torch.Tensor, dtype: torch.dtype) -> np.ndarray:
    """A parameter column as a host array of `dtype` (a view when it already is one)."""
    return torch.as_tensor(values).to(dtype).numpy()


def sample_categorical(weights: torch.Tensor, coins: torch.Tensor) -> torch.Tensor:
    """Inverse-CDF draw per row from non-negative (unnormalised) ``weights`` [A, V], coins [A].

    A zero-weight token is never returned: its CDF step is empty. The one rounding corner
    (coin * total rounding up to total) maps to the last token with positive weight.
    """
    cdf = weights.cumsum(dim=1)
    target = coins.unsqueeze(1) * cdf[:, -1:]
    idx = torch.searchsorted(cdf, target, right=True).squeeze(1)
    vocab = weights.shape[1]
    over = idx >= vocab
    if bool(over.any()):
        last_pos = vocab - 1 - (weights[over] > 0).flip(1).to(torch.int8).argmax(dim=1)
        idx[over] = last_pos
    return idx


def find_child(
    children: torch.Tensor, tokens: torch.Tensor, rows: torch.Tensor, picked: torch.Tensor
) -> torch.Tensor:
    """Global row of the child of ``rows[i]`` whose token is ``picked[i]``, or -1."""
    kids = children[rows]
    kid_tokens = torch.where(kids >= 0, tokens[kids.clamp(min=0)], -1)
    match = kid_tokens == picked.unsqueeze(1)
    slot = match.to(torch.int8).argmax(dim=1, keepdim=True)
    return torch.where(match.any(dim=1), kids.gather(1, slot).squeeze(1), -1)


def _residual_(p: torch.Tensor, q: torch.Tensor, q_scale: torch.Tensor) -> torch.Tensor:
    """normalize(max(p - q * q_scale, 0)) per row (q_scale [R] turns unnormalised q into the
    current draft law). Rows with no residual mass keep p: reachable only by rounding, since
    p <= q everywhere means p == q, and then the child was accepted with probability 1."""
    r = torch.addcmul(p, q, -q_scale.unsqueeze(1)).clamp_(min=0)
    total = r.sum(dim=1, keepdim=True)
    empty = (total <= 0).squeeze(1)
    r.div_(total.masked_fill_(total <= 0, 1.0))
    if bool(empty.any()):
        r[empty] = p[empty]
    return r


def recursive_rejection(
    p: torch.Tensor,
    q: torch.Tensor,
    kids: torch.Tensor,
    tokens: torch.Tensor,
    accept_coins: torch.Tensor,
    replacement: bool,
    num_draws: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Recursive rejection sampling over each row's children, tried in index (= draw) order.

    p: float64 [A, V], normalised target rows of the current nodes; q: float64 [A, V], the draft
    rows (any positive scale; normalised here); kids: [A, C] global child rows (-1 pad);
    accept_coins: float64 [T], one coin per tree row (the child's; column ACCEPT_COIN of the coin
    block, coins.py: the correction is drawn with the parent's DRAW_COIN by the caller).
    Child c is accepted with probability min(1, p(c)/q(c)), tested as ``coin * q(c) < p(c)``.
    On rejection p <- normalize(max(p - q, 0)); without replacement q then drops c and
    renormalises (the law the next draw came from). With replacement, a merged child stands for
    ``num_draws[c]`` consecutive i.i.d. draws: its repeats are rejected with certainty (p(c) is 0
    after the first rejection), but each still applies the residual update, which does not depend
    on the token, so the update is applied num_draws times.

    Rows still trying are kept compacted so that every pass over [rows, V] does useful work.
    Returns (accepted child row or -1, p: the residual to draw the correction from; rows with an
    accepted child hold stale values). ``p`` is updated in place; ``q`` is consumed.
    """
    num_rows, width = kids.shape
    chosen = torch.full((num_rows,), -1, dtype=torch.int64, device=p.device)
    work = torch.arange(num_rows, device=p.device)  # rows still trying, indices into p
    wp, wq = p, q
    inv_zq = 1.0 / q.sum(dim=1)  # q(t) = wq[t] * inv_zq
    wkids = kids
    for j in range(width):
        child = wkids[:, j]
        keep = child >= 0
        if not bool(keep.all()):  # out of children: wp is the residual
            done = ~keep
            p[work[done]] = wp[done]
            work, wp, wq, inv_zq, wkids, child = (
                work[keep], wp[keep], wq[keep], inv_zq[keep], wkids[keep], child[keep]
            )
        if work.numel() == 0:
            return chosen, p
        tok = tokens[child].unsqueeze(1)
        p_c = wp.gather(1, tok).squeeze(1)
        q_c = wq.gather(1, tok).squeeze(1) * inv_zq
        accepted = accept_coins[child] * q_c < p_c
        if bool(accepted.any()):
            chosen[work[accepted]] = child[accepted]
            keep = ~accepted
            work, wp, wq, inv_zq, wkids, child, tok = (
                work[keep], wp[keep], wq[keep], inv_zq[keep], wkids[keep], child[keep], tok[keep]
            )
            if work.numel() == 0:
                return chosen, p
        # every row left rejected its child j
        if replacement and num_draws is not None:
            reps = num_draws[child]
            wp = _residual_(wp, wq, inv_zq)
            for r in range(1, int(reps.max())):
                more = (reps > r).nonzero().squeeze(1)
                wp[more] = _residual_(wp[more], wq[more], inv_zq[more])
        else:
            wp = _residual_(wp, wq, inv_zq)
        if not replacement:
            wq.scatter_(1, tok, 0.0)
            zq = wq.sum(dim=1)
            inv_zq = torch.where(zq > 0, 1.0 / zq.clamp(min=torch.finfo(zq.dtype).tiny), 0.0)
    p[work] = wp
    return chosen, p
