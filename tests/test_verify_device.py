"""Acceptance with the logits on a CUDA device (the path a GPU server takes: the Triton greedy
walk, the torch sampled walk) against the host walks a CPU server takes, for the same trees,
logits and seeded coins. Skipped without a GPU; benchmarks/gpu_check.sh runs it on one."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from support.verify_cases import distinct_sibling_trees
from vllm_treespec.tree import TreeBatch
from vllm_treespec.verify import SamplingParamsBatch, accept_target_only, accept_trees
from vllm_treespec.verify.accept import _target_only_torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

VOCAB = 97


def _random_trees(rng: np.random.Generator, num_requests: int) -> TreeBatch:
    return distinct_sibling_trees(rng, num_requests, VOCAB)


def _peaked_logits(rng: np.random.Generator, tree: TreeBatch) -> torch.Tensor:
    """Rows where each drafted child is often the likely token, so the walks go deep."""
    offsets, tokens, parents = tree.offsets, tree.tokens, tree.parents
    logits = torch.from_numpy(rng.normal(0, 1, (tokens.numel(), VOCAB)).astype(np.float32))
    for child in range(tokens.numel()):
        if int(parents[child]) >= 0:
            start = int(offsets[offsets <= child][-1])
            logits[start + int(parents[child]), tokens[child]] += 4.0
    return logits


def _same(a, b) -> None:
    for name in ("emitted", "num_emitted", "accepted_nodes", "accepted_rows"):
        assert torch.equal(getattr(a, name).cpu(), getattr(b, name).cpu()), name


def test_greedy_on_the_device_equals_the_host_walk() -> None:
    rng = np.random.default_rng(0)
    for _ in range(10):
        tree = _random_trees(rng, 32)
        logits = _peaked_logits(rng, tree)
        params = [type("P", (), {"temperature": 0.0})()] * 32
        width = tree.max_depth + 1
        host = accept_trees(tree, logits, params, [None] * 32, width)
        device = accept_trees(tree, logits.cuda(), params, [None] * 32, width)
        assert device.emitted.is_cuda
        _same(host, device)


def test_sampled_walk_on_the_device_equals_the_host_walk() -> None:
    """Same seeded coins: the torch walk on the GPU picks what the native walk picks on the
    host, except where a coin falls within float rounding of a CDF step (allowed for 1%)."""
    rng = np.random.default_rng(1)
    agree = total = 0
    for trial in range(20):
        tree = _random_trees(rng, 24)
        logits = _peaked_logits(rng, tree)
        kinds = rng.integers(0, 4, 24)
        params = SamplingParamsBatch.from_lists(
            np.where(kinds == 0, 0.0, rng.uniform(0.3, 1.5, 24)).tolist(),
            np.where(kinds == 2, 7, 0).tolist(), np.where(kinds == 3, 0.9, 1.0).tolist(),
            [0.0] * 24)
        seeds = [trial * 100 + b for b in range(24)]
        host = accept_target_only(tree, logits, params,
                                  [torch.Generator().manual_seed(s) for s in seeds])
        device = _target_only_torch(tree.to("cuda"), logits.cuda(), params,
                                    [torch.Generator().manual_seed(s) for s in seeds], None, None)
        same = (host.emitted == device.emitted.cpu()).all(dim=1)
        agree, total = agree + int(same.sum()), total + 24
        assert torch.equal(host.num_emitted[same], device.num_emitted.cpu()[same])
        assert torch.equal(host.accepted_nodes[same], device.accepted_nodes.cpu()[same])
    assert agree >= 0.99 * total


def test_sampled_device_walk_is_the_public_device_path() -> None:
    """accept_target_only sends CUDA logits to the torch walk and returns device tensors."""
    rng = np.random.default_rng(2)
    tree = _random_trees(rng, 8)
    logits = _peaked_logits(rng, tree).cuda()
    params = SamplingParamsBatch.from_lists([0.7] * 8, [0] * 8, [1.0] * 8, [0.0] * 8)
    gens = [torch.Generator().manual_seed(s) for s in range(8)]
    out = accept_target_only(tree, logits, params, gens)
    ref = _target_only_torch(tree.to(logits.device), logits, params,
                             [torch.Generator().manual_seed(s) for s in range(8)], None, None)
    _same(out, ref)
    assert int(out.num_emitted.min()) >= 1
