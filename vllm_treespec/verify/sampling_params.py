"""Per-request sampling parameters and the logits -> target-probabilities transform.

Losslessness is defined against what vLLM would sample WITHOUT speculation, so the transform
replicates vLLM 0.32.0's V1 `Sampler` (not its rejection sampler, which skips min-p on draft rows):

1. logits in float32 (`v1/sample/sampler.py` Sampler.forward: ``logits.to(torch.float32)``);
2. temperature < 1e-5 (``_SAMPLING_EPS``) means greedy: argmax of those float32 logits
   (`Sampler.greedy_sample`; `SamplingParams.sampling_type`);
3. divide by the temperature, greedy rows by 1 (`Sampler.apply_temperature`);
4. min-p, the argmax-invariant logits processor run before top-k/top-p
   (`v1/sample/logits_processor/builtin.py` MinPLogitsProcessor.apply: softmax, mask
   ``p < max(p) * min_p``);
5. top-k then top-p (`v1/sample/ops/topk_topp_sampler.py` apply_top_k_top_p_pytorch, the path
   vLLM takes on CPU; top-k only uses apply_top_k_only); top_k 0, -1 or >= vocab means off
   (`v1/worker/gpu_input_batch.py` add_request stores vocab_size for those);
6. softmax in float32 (`TopKTopPSampler.forward_native`).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

SAMPLING_EPS = 1e-5  # vLLM's _SAMPLING_EPS: temperatures below it are greedy


@dataclass(frozen=True)
class SamplingParamsBatch:
    """Per-request sampling parameters, each a tensor of shape [B].

    ``temperature`` (float32; < 1e-5 = greedy), ``top_k`` (int64; 0 or -1 = off), ``top_p``
    (float32 in (0, 1]; 1 = off), ``min_p`` (float32 in [0, 1]; 0 = off).

    Example::

        params = SamplingParamsBatch.from_lists(temperature=[0.0, 0.8], top_k=[0, 50],
                                                top_p=[1.0, 0.9], min_p=[0.0, 0.05])
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    min_p: torch.Tensor

    @classmethod
    def from_lists(
        cls,
        temperature: Sequence[float],
        top_k: Sequence[int] | None = None,
        top_p: Sequence[float] | None = None,
        min_p: Sequence[float] | None = None,
    ) -> SamplingParamsBatch:
        """Build from Python sequences; omitted filters are off for every request."""
        n = len(temperature)

        def col(values, default, dtype):
            return torch.tensor(list(values) if values is not None else [default] * n, dtype=dtype)

        return cls(
            temperature=col(temperature, 1.0, torch.float32),
            top_k=col(top_k, 0, torch.int64),
            top_p=col(top_p, 1.0, torch.float32),
            min_p=col(min_p, 0.0, torch.float32),
        )

    @classmethod
    def from_params(cls, params: Sequence[object]) -> SamplingParamsBatch:
        """From objects with ``temperature``, ``top_k``, ``top_p``, ``min_p`` attributes (vLLM's
        SamplingParams; top_k None/0/-1 = off)."""
        return cls.from_lists(
            temperature=[float(p.temperature) for p in params],
            top_k=[int(p.top_k or 0) for p in params],
            top_p=[float(p.top_p) for p in params],
            min_p=[float(p.min_p) for p in params])

    @classmethod
    def greedy(cls, batch_size: int) -> SamplingParamsBatch:
        return cls.from_lists([0.0] * batch_size)

    @classmethod
    def random(cls, batch_size: int, temperature: float = 1.0) -> SamplingParamsBatch:
        """Plain sampling at one temperature, no filters."""
        return cls.from_lists([temperature] * batch_size)

    @property
    def batch_size(self) -> int:
        return int(self.temperature.numel())

    @property
    def is_greedy(self) -> torch.Tensor:
        """bool [B]: requests vLLM samples greedily."""
        return self.temperature < SAMPLING_EPS

    def validated(self, batch_size: int, device: torch.device) -> SamplingParamsBatch:
        """Check shapes and ranges (vLLM's SamplingParams rules) and move to ``device``."""
        fields = {}
        for name, dtype in (
            ("temperature", torch.float32),
            ("top_k", torch.int64),
            ("top_p", torch.float32),
            ("min_p", torch.float32),
        ):
            value = torch.as_tensor(getattr(self, name))
            if value.shape != (batch_size,):
                raise ValueError(
                    f"sampling.{name} must have shape [{batch_size}] (one per request), got "
                    f"{tuple(value.shape)}"
                )
            if name == "top_k" and value.dtype.is_floating_point:
                raise TypeError("sampling.top_k must hold integers")
            fields[name] = value.to(device=device, dtype=dtype)
        t, k, p, m = fields["temperature"], fields["top_k"], fields["top_p"], fields["min_p"]
        if bool((t < 0).any()) or bool(torch.isnan(t).any()):
            raise ValueError("sampling.temperature must be >= 0")
        if bool((k < -1).any()):
            raise ValueError("sampling.top_k must be 0 or -1 (off) or >= 1")
        if bool(((p <= 0) | (p > 1)).any()) or bool(torch.isnan(p).any()):
            raise ValueError("sampling.top_p must be in (0, 1]")
        if bool(((m < 0) | (m > 1)).any()) or bool(torch.isnan(m).any()):
            raise ValueError("sampling.min_p must be in [0, 1]")
        return SamplingParamsBatch(**fields)

    def rows(self, index: torch.Tensor) -> SamplingParamsBatch:
        """Parameters gathered per row (``index`` maps rows to requests)."""
        return SamplingParamsBatch(
            self.temperature[index], self.top_k[index], self.top_p[index], self.min_p[index]
        )


def greedy_tokens(logits: torch.Tensor) -> torch.Tensor:
    """Argmax of float32 logits, first index on ties, as vLLM's greedy_sample on raw logits:
    on the host its CPU op ``torch.ops._C.greedy_argmax`` where vLLM registered it (what
    decoding without speculation uses), torch's argmax otherwise (vLLM's CUDA path)."""
    op = getattr(getattr(torch.ops, "_C", None), "greedy_argmax", None)
    if op is not None and logits.device.type == "cpu":
        return op(logits.to(torch.float32).contiguous()).to(torch.int64)
    return logits.to(torch.float32).argmax(dim=-1)


def _apply_min_p(logits: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    probs = torch.softmax(logits, dim=-1)
    threshold = probs.amax(dim=-1, keepdim=True).mul_(min_p.unsqueeze(1))
    return logits.masked_fill_(probs < threshold, float("-inf"))


def _apply_top_k_only(logits: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    # Threshold = k-th largest logit; ties with it are kept. Rows with k == vocab are untouched.
    vocab = logits.shape[1]
    off = k == vocab
    k = k.masked_fill(off, 1)
    kth = logits.topk(int(k.max()), dim=1).values.gather(1, (k - 1).unsqueeze(1))
    kth.masked_fill_(off.unsqueeze(1), float("-inf"))
    return logits.masked_fill_(logits < kth, float("-inf"))


def _apply_top_k_top_p_sorted(
    logits: torch.Tensor, k: torch.Tensor | None, p: torch.Tensor
) -> torch.Tensor:
    # Same ops, same order as vLLM's sort-based path, so ties at the top-p boundary break alike.
    logits_sort, logits_idx = logits.sort(dim=-1, descending=False)
    if k is not None:
        kth = logits_sort.gather(1, (logits_sort.size(1) - k).unsqueeze(1))
        logits_sort.masked_fill_(logits_sort < kth, float("-inf"))
    probs_sort = logits_sort.softmax(dim=-1)
    probs_sum = torch.cumsum(probs_sort, dim=-1, out=probs_sort)
    top_p_mask = probs_sum <= 1 - p.unsqueeze(1)
    top_p_mask[:, -1] = False  # keep at least one token
    logits_sort.masked_fill_(top_p_mask, float("-inf"))
    return logits.scatter_(dim=-1, index=logits_idx, src=logits_sort)


def process_logits(
    logits: torch.Tensor, params: SamplingParamsBatch, inplace: bool = False
) -> torch.Tensor:
    """Apply temperature, min-p, top-k, top-p to rows of ``logits`` (float32 result).

    ``params`` holds one entry per row. Rows with temperature < 1e-5 are divided by 1 (their
    distribution is not used; greedy rows take :func:`greedy_tokens`). ``inplace`` lets a caller
    that owns a float32 ``logits`` skip the copy.
    """
    if inplace and logits.dtype == torch.float32:
        out = logits
    else:
        out = logits.to(torch.float32, copy=True)
    vocab = out.shape[1]
    temp = torch.where(params.temperature < SAMPLING_EPS, 1.0, params.temperature)
    out.div_(temp.unsqueeze(1))
    if bool((params.min_p != 0).any()):
        _apply_min_p(out, params.min_p)
    k_on = (params.top_k > 0) & (params.top_k < vocab)
    p_on = params.top_p < 1
    k = torch.where(k_on, params.top_k, vocab) if bool(k_on.any()) else None
    if bool(p_on.any()):
        return _apply_top_k_top_p_sorted(out, k, params.top_p)
    if k is not None:
        return _apply_top_k_only(out, k)
    return out


def target_probs(logits: torch.Tensor, params: SamplingParamsBatch) -> torch.Tensor:
    """Processed target distribution per row, float32 [N, V]; greedy rows are one-hot at argmax.

    This is exactly the distribution vLLM's V1 sampler draws the next token from.

    Example::

        probs = target_probs(torch.randn(2, 8), SamplingParamsBatch.from_lists([0.7, 0.0]))
    """
    probs = torch.softmax(process_logits(logits, params), dim=-1, dtype=torch.float32)
    greedy = params.temperature < SAMPLING_EPS
    if bool(greedy.any()):
        onehot = torch.zeros_like(probs)
        onehot.scatter_(1, greedy_tokens(logits).unsqueeze(1), 1.0)
        probs = torch.where(greedy.unsqueeze(1), onehot, probs)
    return probs
