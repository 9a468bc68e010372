"""Triton paged tree attention against the float64 reference (CPU: Triton's interpreter).

Caches are NaN wherever no request wrote, block tables are shuffled and point their unused
columns at random blocks, and outputs are NaN before each call, so a read outside a request's
prefix + tree or a row the kernel forgets to write fails the comparison.
"""
from __future__ import annotations

import pytest
import torch

from harness.kernel_reference import paged_tree_attention_reference
from harness.triton_mode import triton_mode_problem
from support.kernel_cases import paged_tree_case, poison_

if (_why := triton_mode_problem()) is not None:
    pytest.skip(_why, allow_module_level=True)

from vllm_treespec.kernels.tree_attention import (  # noqa: E402
    choose_num_splits,
    paged_tree_attention,
)

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
TOL = {torch.float32: dict(atol=1e-4, rtol=1e-4), torch.float16: dict(atol=3e-3, rtol=1e-2),
       torch.bfloat16: dict(atol=2e-2, rtol=2e-2)}


def _run(case, scale, **kw):
    out = poison_(torch.empty_like(case.query))
    res = paged_tree_attention(case.query, case.key_cache, case.value_cache, case.block_table,
                               case.prefix_lens, case.q_offsets, case.anc_mask, scale,
                               causal=case.causal, out=out, **kw)
    assert res is out
    return out


def _reference(case, scale, soft_cap=None):
    return paged_tree_attention_reference(case.query, case.key_cache, case.value_cache,
                                          case.block_table, case.prefix_lens, case.q_offsets,
                                          case.parents, scale, causal=case.causal,
                                          logits_soft_cap=soft_cap)


# seed, dtype, head_dim, (Hq, Hkv), block_size, tree sizes, prefix lengths, causal flags,
# num_splits, (BLOCK_M, BLOCK_N); small blocks make several row and key tiles per request.
CASES = [
    # decode row (n=1, empty prefix), GQA 2, a causal chain request, one split
    (0, torch.float32, 64, (4, 2), 16, [1, 9, 70, 5], [0, 40, 33, 100],
     [False, False, False, True], 1, (16, 16)),
    # GQA 4 packed into M, three prefix splits (one of them empty for the short request)
    (1, torch.float16, 128, (8, 2), 16, [17, 1, 3], [130, 7, 64], None, 3, (16, 32)),
    # head dim 256, no GQA, block size 32, two splits
    (2, torch.bfloat16, 256, (2, 2), 32, [33, 2], [50, 16], None, 2, (16, 16)),
    # 130 nodes = 3 mask words, rows past 64 and 128, plus a decode row
    (3, torch.float16, 64, (1, 1), 16, [130, 1], [20, 45], None, 1, (32, 16)),
    # default tile sizes (what a GPU runs), mixed batch
    (4, torch.bfloat16, 128, (4, 1), 16, [16, 1, 40], [200, 3, 61], [False, True, False], 2,
     (None, None)),
]


@pytest.mark.parametrize("seed,dtype,d,heads,bs,sizes,prefixes,causal,splits,blocks", CASES)
def test_matches_float64_reference(seed, dtype, d, heads, bs, sizes, prefixes, causal, splits,
                                   blocks):
    case = paged_tree_case(seed, sizes, prefixes, *heads, d, dtype, bs, causal, device=DEVICE)
    scale = d ** -0.5
    out = _run(case, scale, num_splits=splits, block_m=blocks[0], block_n=blocks[1])
    ref = _reference(case, scale)
    assert not torch.isnan(ref).any()
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out.double(), ref, **TOL[dtype])


@pytest.mark.parametrize("seed", [10, 11])
def test_random_shapes(seed):
    """Drawn per seed: tree sizes, context lengths, causal flags, GQA, dtype, splits, tiles."""
    import numpy as np

    rng = np.random.default_rng(seed)
    b = int(rng.integers(1, 6))
    sizes = [int(x) for x in rng.integers(1, 80, size=b)]
    prefixes = [int(x) for x in rng.integers(0, 300, size=b)]
    causal = [bool(x) for x in rng.random(b) < 0.25]
    hkv, group = int(rng.integers(1, 3)), int(rng.choice([1, 2, 4]))
    dtype = [torch.float32, torch.float16, torch.bfloat16][int(rng.integers(3))]
    d, bs = int(rng.choice([64, 128])), int(rng.choice([16, 32]))
    case = paged_tree_case(seed, sizes, prefixes, hkv * group, hkv, d, dtype, bs, causal,
                           device=DEVICE)
    out = _run(case, d ** -0.5, num_splits=int(rng.integers(1, 5)),
               block_m=int(rng.choice([16, 32])), block_n=int(rng.choice([16, 32, 64])))
    torch.testing.assert_close(out.double(), _reference(case, d ** -0.5), **TOL[dtype])


def test_soft_cap_and_one_mask_word_per_tile():
    case = paged_tree_case(5, [12, 24], [31, 0], 4, 2, 64, torch.float32, 16, device=DEVICE)
    out = _run(case, 0.3, logits_soft_cap=5.0, num_splits=2, block_m=16, block_n=64)
    torch.testing.assert_close(out.double(), _reference(case, 0.3, soft_cap=5.0),
                               **TOL[torch.float32])


def test_reused_split_workspace_gives_the_same_output():
    """One scratch for every layer of a step: a second call over it (other queries) is right
    too, and a scratch too small for the call is refused with its required size."""
    from vllm_treespec.kernels.tree_attention import split_workspace

    case = paged_tree_case(8, [12, 5], [40, 9], 4, 2, 32, torch.float32, 16, device=DEVICE)
    t, hq, d = case.query.shape
    ws = split_workspace(3, t, hq, d, DEVICE)
    assert split_workspace(1, t, hq, d, DEVICE) is None
    for _ in range(2):
        case.query.normal_()
        out = _run(case, 0.25, num_splits=3, block_m=16, block_n=16, workspace=ws)
        torch.testing.assert_close(out.double(), _reference(case, 0.25), **TOL[torch.float32])
    with pytest.raises(ValueError, match="split_workspace"):
        _run(case, 0.25, num_splits=3, block_m=16, block_n=16, workspace=ws[:-1])


def test_reference_agrees_with_cpu_reference():
    """The FA-layout reference against support.attention_reference's slot-by-slot one (token_major)."""
    from support.attention_reference import tree_attention_reference

    case = paged_tree_case(6, [5, 9], [7, 18], 4, 2, 32, torch.float32, 16)
    ours = _reference(case, 0.2)
    theirs = tree_attention_reference(case.query, case.key_cache.permute(0, 2, 1, 3),
                                      case.value_cache.permute(0, 2, 1, 3), case.block_table,
                                      case.prefix_lens, case.q_offsets, case.parents, 0.2,
                                      layout="token_major")
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)


def test_rejects_what_it_cannot_do():
    case = paged_tree_case(7, [3], [4], 2, 1, 32, torch.float16, 16)
    args = (case.query, case.key_cache, case.value_cache, case.block_table, case.prefix_lens,
            case.q_offsets, case.anc_mask, 1.0)
    with pytest.raises(ValueError, match="block_n"):
        paged_tree_attention(*args, block_n=128)
    with pytest.raises(NotImplementedError, match="dtype"):
        paged_tree_attention(case.query, case.key_cache.float(), *args[2:])
    with pytest.raises(ValueError, match="anc_mask"):
        paged_tree_attention(*args[:6], case.anc_mask.int(), 1.0)


def test_choose_num_splits():
    assert choose_num_splits(num_programs=200, max_prefix=32768, num_sms=132, block_n=64) == 1
    assert choose_num_splits(num_programs=8, max_prefix=512, num_sms=132, block_n=64) == 1
    assert choose_num_splits(num_programs=8, max_prefix=32768, num_sms=132, block_n=64) == 32
    s = choose_num_splits(num_programs=40, max_prefix=4096, num_sms=132, block_n=64)
    assert s == 4 and s & (s - 1) == 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="GPU-only size (interpreter too slow)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_large_batch_on_gpu(dtype):
    import numpy as np

    rng = np.random.default_rng(8)
    sizes = [int(x) for x in rng.integers(1, 257, size=32)]
    prefixes = [int(x) for x in rng.integers(0, 5000, size=32)]
    case = paged_tree_case(8, sizes, prefixes, 32, 8, 128, dtype, 16, device="cuda")
    for splits in (None, 1, 8):
        out = _run(case, 128 ** -0.5, num_splits=splits)
        torch.testing.assert_close(out.double(), _reference(case, 128 ** -0.5), **TOL[dtype])
