"""DraftSampler (drafters/draft_sampling.py): draws without replacement follow q in draw order,
q is the request's own processed distribution over the served vocabulary, and seeded requests
draw reproducibly from a stream of their own."""
from __future__ import annotations

import collections
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from support.verify_cases import chi_square_pvalue
from vllm_treespec.drafters.draft_sampling import DraftSampler, samples
from vllm_treespec.verify import SamplingParamsBatch
from vllm_treespec.verify.sampling_params import target_probs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _params(temperature=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=None):
    return SimpleNamespace(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p, seed=seed)


def test_two_draws_without_replacement_follow_q_in_draw_order():
    q = torch.tensor([[0.4, 0.25, 0.2, 0.1, 0.05]])
    n = 40_000
    tokens, logq = DraftSampler.draw(q.expand(n, -1).contiguous(), 2, torch.Generator().manual_seed(1))
    assert (tokens[:, 0] != tokens[:, 1]).all()
    np.testing.assert_allclose(logq, np.log(q[0].double().numpy()[tokens]), rtol=1e-12)
    qs = q[0].double().numpy()
    expected = {a * 5 + b: qs[a] * qs[b] / (1 - qs[a]) for a in range(5) for b in range(5) if a != b}
    counts = collections.Counter((tokens[:, 0] * 5 + tokens[:, 1]).tolist())
    stat, dof, p = chi_square_pvalue(counts, expected)
    assert dof >= 15 and p > 1e-3, (stat, p)


def test_draws_stop_at_the_support():
    q = torch.tensor([[0.0, 0.7, 0.0, 0.3]])
    tokens, logq = DraftSampler.draw(q, 3, torch.Generator().manual_seed(0))
    assert sorted(tokens[0, :2].tolist()) == [1, 3] and tokens[0, 2] == -1 and logq[0, 2] == -np.inf


@pytest.mark.parametrize("params", [_params(0.7), _params(1.0, top_k=3), _params(1.3, top_p=0.8),
                                    _params(1.0, min_p=0.2)])
def test_q_is_the_request_processing_over_the_served_vocabulary(params):
    lp = torch.log_softmax(torch.randn(3, 12, generator=torch.Generator().manual_seed(2)), -1)
    q = DraftSampler(vocab=10).q(lp, params)
    want = target_probs(lp[:, :10], SamplingParamsBatch.from_params([params] * 3))
    torch.testing.assert_close(q, want)
    wider = DraftSampler(vocab=14).q(lp, params)       # draft vocabulary smaller than the target's
    assert wider.shape == (3, 14) and (wider[:, 12:] == 0).all()
    torch.testing.assert_close(wider[:, :12], target_probs(lp, SamplingParamsBatch.from_params([params] * 3)))


def test_seeded_requests_draw_their_own_reproducible_stream():
    q = torch.full((1, 50), 0.02)
    a, b = DraftSampler(None), DraftSampler(None)
    draw = lambda s, r, p: s.draw(q, 4, s.generator(r, p))[0].tolist()
    seeded = _params(seed=7)
    assert draw(a, "x", seeded) == draw(b, "y", seeded)            # same seed, any request id
    assert draw(a, "x", seeded) != draw(a, "z", _params(seed=8))
    assert a.generator("u", _params()) is a.shared                 # unseeded: the shared stream
    a.release(["x"])
    assert "x" not in a.generators
    assert samples(_params(1.0)) and not samples(_params(0.0)) and not samples(None)
