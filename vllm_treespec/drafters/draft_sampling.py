"""Sampled drafting: children drawn from the drafter's distribution q for requests that sample,
so the engine verifies them with recursive rejection sampling (verify/accept.py, mode ``rrs``).

Why sample instead of top-k: at temperature > 0 the target-only rule accepts a top-k child c
with probability p(c), so a deep top-k chain pays off only where the target is confident; RRS
accepts a draw x with probability min(1, p(x)/q(x)) and then tries the next draw against the
residual, which accepts about sum_x min(p(x), q(x)) per level when q is close to p.

q for a request is the drafter's log-probs processed with that request's own temperature, top-k,
top-p and min-p (verify/sampling_params.py, the target's transform), restricted to the served
model's vocabulary. Draws are without replacement (Gumbel-top-k keys: the k largest of
log q + Gumbel noise are k sequential draws without replacement, in draw order). Each seeded
request draws from its own generator, derived from its seed, so a seeded request drafts, and
therefore samples, the same way in every run that batches it the same way; the others share one
generator. Across different batch compositions the draft model's batched forward can round q
differently in the last bits, which can flip a near-tied draw or acceptance test and so change a
seeded request's sample (each output is still an exact sample of the target distribution); the
same holds, more rarely, for top-k trees from a draft model, whose ranking can flip at near-ties.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from vllm_treespec.verify.sampling_params import SAMPLING_EPS, SamplingParamsBatch, process_logits

__all__ = ["DraftProbs", "DraftSampler", "samples"]

_SEED_MIX = 0x9E3779B97F4A7C15  # drafting seed = f(request seed): not the request's own stream


@dataclass(frozen=True)
class DraftProbs:
    """The q rows of one request's sampled tree.

    ``node_rows[v]`` is the row of ``probs`` holding the distribution node v's children were
    drawn from, -1 for nodes that were not expanded (leaves).
    """
    node_rows: np.ndarray     # int64 [num_nodes]
    probs: torch.Tensor       # float32 [rows, V]


def samples(params: Any) -> bool:
    """Does a request with these SamplingParams sample (temperature >= vLLM's epsilon)?"""
    return params is not None and float(params.temperature) >= SAMPLING_EPS


class DraftSampler:
    """q rows and draws without replacement, per request (module docstring)."""

    def __init__(self, vocab: int | None, seed: int = 0) -> None:
        self.vocab = vocab
        self.shared = torch.Generator().manual_seed(seed)
        self.generators: dict[str, torch.Generator] = {}

    def release(self, req_ids: Sequence[str]) -> None:
        for r in req_ids:
            self.generators.pop(r, None)

    def generator(self, req_id: str, params: Any) -> torch.Generator:
        seed = getattr(params, "seed", None)
        if seed is None:
            return self.shared
        gen = self.generators.get(req_id)
        if gen is None:
            gen = self.generators[req_id] = torch.Generator().manual_seed(
                (int(seed) * _SEED_MIX + 1) % (1 << 63))
        return gen

    def q(self, logprobs: torch.Tensor, params: Any) -> torch.Tensor:
        """float32 [n, V]: the request's processed distribution over the served vocabulary."""
        lp = logprobs.to(torch.float32)
        vocab = self.vocab if self.vocab is not None else lp.shape[1]
        if lp.shape[1] > vocab:
            lp = lp[:, :vocab]
        elif lp.shape[1] < vocab:       # draft vocabulary smaller than the target's: q = 0 there
            lp = torch.cat([lp, lp.new_full((lp.shape[0], vocab - lp.shape[1]), -torch.inf)], 1)
        batch = SamplingParamsBatch.from_params([params])
        rows = torch.zeros(lp.shape[0], dtype=torch.int64)
        return torch.softmax(process_logits(lp, batch.rows(rows)), dim=-1, dtype=torch.float32)

    @staticmethod
    def draw(q: torch.Tensor, k: int, gen: torch.Generator) -> tuple[np.ndarray, np.ndarray]:
        """k draws without replacement per row of q [n, V], in draw order: (tokens, log q), -1 /
        -inf padded where a row has fewer than k tokens of positive probability."""
        u = torch.rand(q.shape, generator=gen, dtype=torch.float64)
        keys = q.double().log() - (-u.log()).log()
        k = min(k, q.shape[1])
        top = torch.topk(keys, k, dim=1)
        ok = torch.isfinite(top.values)
        tokens = torch.where(ok, top.indices, -1)
        logq = torch.where(ok, q.double().gather(1, top.indices).log(), -torch.inf)
        return tokens.numpy(), logq.numpy()
