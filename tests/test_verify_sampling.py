"""Target processing (temperature, min-p, top-k, top-p) matches vLLM 0.32.0's V1 sampler."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_treespec.verify import SamplingParamsBatch, process_logits, target_probs
from vllm_treespec.verify.sampling_params import greedy_tokens


def _logits_with_ties(rng: np.random.Generator, rows: int, vocab: int) -> torch.Tensor:
    # Quantised values create many exact ties, the case where implementations disagree.
    x = np.round(rng.normal(0, 2, (rows, vocab)) * 2) / 2
    x[rng.random((rows, vocab)) < 0.05] = -np.inf
    x[:, 0] = np.where(np.isinf(x[:, 0]), 0.0, x[:, 0])  # keep a finite entry per row
    return torch.tensor(x, dtype=torch.float32)


def _random_params(rng: np.random.Generator, rows: int, vocab: int) -> SamplingParamsBatch:
    temp = rng.choice([0.0, 0.3, 0.7, 1.0, 1.6], rows)
    top_k = rng.choice([-1, 0, 1, 2, 5, vocab - 1, vocab, vocab + 3], rows)
    top_p = rng.choice([1.0, 0.95, 0.8, 0.5, 0.1], rows)
    min_p = rng.choice([0.0, 0.0, 0.05, 0.2, 0.9], rows)
    return SamplingParamsBatch.from_lists(
        temp.tolist(), top_k.tolist(), top_p.tolist(), min_p.tolist()
    )


def _vllm_processed(logits: torch.Tensor, params: SamplingParamsBatch) -> torch.Tensor:
    """Run vLLM's own ops in Sampler.sample's order on a copy of ``logits``."""
    from vllm.v1.sample.logits_processor.builtin import MinPLogitsProcessor
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.sample.sampler import Sampler

    vocab = logits.shape[1]
    out = logits.to(torch.float32).clone()
    temp = params.temperature
    out = Sampler.apply_temperature(out, temp, all_random=bool((temp >= 1e-5).all()))
    if bool((params.min_p != 0).any()):
        min_p = object.__new__(MinPLogitsProcessor)  # only .apply's state is needed
        min_p.min_p_count = int((params.min_p != 0).sum())
        min_p.min_p = params.min_p.unsqueeze(1)
        out = min_p.apply(out)
    # gpu_input_batch.add_request: top_k outside (0, vocab) is stored as vocab; None when unused.
    k_on = (params.top_k > 0) & (params.top_k < vocab)
    k = torch.where(k_on, params.top_k, vocab).to(torch.int32) if bool(k_on.any()) else None
    p = params.top_p if bool((params.top_p < 1).any()) else None
    return apply_top_k_top_p(out, k, p)


def test_processing_is_bitwise_vllm():
    pytest.importorskip("vllm")
    rng = np.random.default_rng(0)
    for vocab in (7, 50, 1000):
        logits = _logits_with_ties(rng, 400, vocab)
        params = _random_params(rng, 400, vocab)
        ours = process_logits(logits, params)
        ref = _vllm_processed(logits, params)
        assert torch.equal(ours, ref)
        assert torch.equal(torch.isinf(ours), torch.isinf(ref))
    # Batches with only one kind of filter take vLLM's other code paths (top-k only, none).
    for top_p, top_k, min_p in ((1.0, 3, 0.0), (1.0, 0, 0.0), (0.7, 0, 0.0), (1.0, 0, 0.1)):
        logits = _logits_with_ties(rng, 64, 40)
        params = SamplingParamsBatch.from_lists(
            [0.8] * 64, [top_k] * 64, [top_p] * 64, [min_p] * 64
        )
        assert torch.equal(process_logits(logits, params), _vllm_processed(logits, params))


def test_greedy_argmax_matches_vllm_cpu_kernel():
    """vLLM's CPU sampler takes torch.ops._C.greedy_argmax; ties go to the first index."""
    pytest.importorskip("vllm")
    from vllm.platforms import current_platform

    # registers torch.ops._C from the build this CPU runs (vllm._C needs AVX512-bf16)
    current_platform.import_kernels()

    if not hasattr(torch.ops._C, "greedy_argmax"):
        pytest.skip("this vLLM build has no CPU greedy_argmax kernel")
    rng = np.random.default_rng(1)
    for vocab in (7, 1000, 32000):
        logits = _logits_with_ties(rng, 64, vocab)
        assert torch.equal(greedy_tokens(logits), torch.ops._C.greedy_argmax(logits).long())


def test_filters_by_hand():
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0, -3.0]])
    one = lambda **kw: SamplingParamsBatch.from_lists([1.0], **{k: [v] for k, v in kw.items()})
    kept = lambda **kw: torch.isfinite(process_logits(logits, one(**kw)))[0].tolist()
    # top-k keeps every token tied with the k-th largest logit
    assert kept(top_k=2) == [True, True, True, False, False]
    assert kept(top_k=0) == kept(top_k=-1) == kept(top_k=5) == kept(top_k=99) == [True] * 5
    # top-p keeps the smallest top set whose mass reaches p, and always at least one token
    assert kept(top_p=0.01) == [True, False, False, False, False]
    # min-p drops tokens below min_p * max prob
    probs = torch.softmax(logits, -1)[0]
    assert kept(min_p=0.3) == (probs >= 0.3 * probs.max()).tolist()
    # temperature divides logits before the filters
    t = SamplingParamsBatch.from_lists([0.5])
    assert torch.allclose(process_logits(logits, t), logits / 0.5)


def test_target_probs_greedy_rows_are_one_hot():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [0.0, 3.0, 3.0, 1.0]])
    params = SamplingParamsBatch.from_lists([0.0, 1.0], top_k=[1, 0])
    probs = target_probs(logits, params)
    assert probs[0].tolist() == [0.0, 1.0, 0.0, 0.0]  # first index on ties, filters ignored
    assert torch.allclose(probs[1], torch.softmax(logits[1], -1))
    assert torch.allclose(probs.sum(-1), torch.ones(2))


def test_sampling_params_validation():
    ok = SamplingParamsBatch.from_lists([1.0, 0.5])
    with pytest.raises(ValueError, match=r"shape \[3\]"):
        ok.validated(3, torch.device("cpu"))
    for kw, msg in (
        (dict(temperature=[-0.1]), "temperature"),
        (dict(temperature=[1.0], top_p=[0.0]), "top_p"),
        (dict(temperature=[1.0], top_p=[1.5]), "top_p"),
        (dict(temperature=[1.0], min_p=[1.5]), "min_p"),
        (dict(temperature=[1.0], top_k=[-2]), "top_k"),
    ):
        with pytest.raises(ValueError, match=msg):
            SamplingParamsBatch.from_lists(**kw).validated(1, torch.device("cpu"))
