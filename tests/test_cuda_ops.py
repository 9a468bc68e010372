"""CUDA kernels of csrc/cuda/ against the torch rules (needs a GPU and TREESPEC_BUILD_CUDA=1).

Skipped on CPU hosts and when the opt-in extension was not built; the compile-only check is
tests/test_cuda_compile.py.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.kernel_reference import compact_kv_reference
from support.greedy_reference import accept_greedy
from support.verify_cases import random_tree_batch
from vllm_treespec.kernels import cuda_ops
from vllm_treespec.kernels.kv_compaction import KVLayers

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and cuda_ops.available()),
                                reason="needs a CUDA GPU and vllm_treespec._C_cuda "
                                       "(build with TREESPEC_BUILD_CUDA=1)")


@pytest.mark.parametrize("seed,sizes", [(0, [1, 2, 17, 64, 300]), (1, [256] * 8)])
def test_greedy_accept_matches_torch_rule(seed, sizes):
    rng = np.random.default_rng(seed)
    tree = random_tree_batch(rng, sizes, vocab=8, max_children=2)
    logits = torch.from_numpy(rng.standard_normal((int(tree.offsets[-1]), 8)).astype("f4"))
    toks, pars, offs = tree.tokens, tree.parents, tree.offsets.tolist()
    for b in range(len(sizes)):                        # make the argmax follow a child often
        for i in range(offs[b] + 1, offs[b + 1]):
            if rng.random() < 0.6:
                logits[offs[b] + int(pars[i]), int(toks[i])] += 10.0
    want = accept_greedy(tree, logits)
    got = cuda_ops.greedy_tree_accept(tree.offsets.cuda(), toks.cuda(), pars.cuda(),
                                      logits.argmax(1).cuda(), want.emitted.shape[1])
    for g, w in zip(got, (want.emitted, want.accepted_nodes, want.num_emitted)):
        assert torch.equal(g.cpu(), w)


@pytest.mark.parametrize("dtype,d", [(torch.bfloat16, 128), (torch.float16, 3),
                                     (torch.float8_e4m3fn, 5)])
def test_kv_compact_matches_reference(dtype, d):
    gen = torch.Generator().manual_seed(0)
    caches = [torch.randn(2, 16, 16, 4, d, generator=gen).to(dtype).cuda() for _ in range(6)]
    want = [c.clone() for c in caches]
    # request 0: alias chain (nodes 2..9 at depths 1..8); request 1: two moves and a no-op
    src = torch.tensor([[18, 19, 20, 21, 22, 23, 24, 25], [70, 72, 74, -1, -1, -1, -1, -1]])
    dst = torch.tensor([[17, 18, 19, 20, 21, 22, 23, 24], [70, 71, 72, -1, -1, -1, -1, -1]])
    cuda_ops.compact_kv(KVLayers.from_caches(caches), src.cuda(), dst.cuda())
    compact_kv_reference([v.view(torch.uint8) for c in want for v in c.unbind(0)], src.cuda(),
                         dst.cuda())
    for got, exp in zip(caches, want):
        assert torch.equal(got.view(torch.uint8), exp.view(torch.uint8))
