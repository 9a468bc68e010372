"""CPU tree attention over vLLM's paged KV cache against a float64 per-node reference.

Caches start as NaN and block tables point unused columns at random blocks, so reading any slot
that was not written (or another request's slot) turns the output into NaN. The layout itself is
checked against vLLM's own ``cpu_attn_reshape_and_cache`` (skipped without vLLM's CPU ops).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from harness.paged_cache import random_block_table, split_kv
from harness.random_trees import random_tree
from support.attention_reference import (
    logical_slots,
    poisoned_cache,
    read_slot_reference,
    tree_attention_reference,
    write_slots,
)
from vllm_treespec.attention.cpu_kv_layout import check_layout, slot_element_offsets
from vllm_treespec.attention.tree_attention_cpu import (
    apply_tree_attention,
    decode_anc_mask,
    gather_paged_kv,
    plan_tree_attention,
    tree_attention,
)
from vllm_treespec.tree import DraftTree, TreeBatch

# (layout, cache dtype, block size, head size): the ISA layouts vLLM picks on x86, plus plain.
CONFIGS = [
    ("token_major", torch.float32, 16, 32),
    ("vec", torch.float32, 16, 32),
    ("vec", torch.bfloat16, 32, 64),
    ("vec16", torch.float32, 16, 80),
    ("amx", torch.bfloat16, 32, 32),
]
ATOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2}


def _case(seed: int, layout: str, dtype: torch.dtype, bs: int, d: int, sizes: list[int],
          prefixes: list[int], hq: int, hkv: int):
    """Random trees, block table and cache with every request's prefix + tree slots written."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    batch = TreeBatch.from_trees([random_tree(rng, n - 1, max_children=4) for n in sizes])
    need = [-(-(p + n) // bs) for p, n in zip(prefixes, sizes)]
    num_blocks = sum(need) + 3                      # a few blocks nobody owns (all NaN)
    table = random_block_table(gen, need, num_blocks, max(need) + 2)
    kv = poisoned_cache(num_blocks, hkv, bs, d, dtype)
    for r, (p, n) in enumerate(zip(prefixes, sizes)):
        slots = logical_slots(table[r], torch.arange(p + n), bs)
        write_slots(kv, slots, torch.randn(p + n, hkv, d, generator=gen),
                    torch.randn(p + n, hkv, d, generator=gen), layout)
    query = torch.randn(batch.num_rows, hq, d, generator=gen).to(dtype)
    return batch, table, kv, query


@pytest.mark.parametrize("layout,dtype,bs,d", CONFIGS)
@pytest.mark.parametrize("seed,sizes,prefixes,heads", [
    (0, [1, 7, 70, 20], [0, 15, 33, 100], (4, 2)),       # root-only, 2 mask words, GQA
    (1, [64, 65, 3], [16, 31, 0], (2, 2)),               # block-boundary prefixes, no GQA
    (2, [12], [47], (6, 2)),                             # single request, GQA 3
])
def test_matches_float64_reference(layout, dtype, bs, d, seed, sizes, prefixes, heads):
    hq, hkv = heads
    batch, table, kv, query = _case(seed, layout, dtype, bs, d, sizes, prefixes, hq, hkv)
    kc, vc = split_kv(kv)
    prefix = torch.tensor(prefixes)
    scale = d ** -0.5
    out = tree_attention(query, kc, vc, table, prefix, batch.offsets, batch.anc_mask, scale,
                         layout=layout)
    ref = tree_attention_reference(query, kc, vc, table, prefix, batch.offsets, batch.parents,
                                   scale, layout=layout)
    assert out.dtype == dtype and out.shape == query.shape
    assert not torch.isnan(ref).any()
    torch.testing.assert_close(out.double(), ref, atol=ATOL[dtype], rtol=1e-2)


@pytest.mark.parametrize("layout,dtype,bs,d", CONFIGS[1:3])
def test_soft_cap_and_float64_compute(layout, dtype, bs, d):
    batch, table, kv, query = _case(3, layout, dtype, bs, d, [9, 30], [5, 40], 4, 2)
    kc, vc = split_kv(kv)
    prefix = torch.tensor([5, 40])
    args = (query, kc, vc, table, prefix, batch.offsets)
    for cap in (None, 1.5):
        ref = tree_attention_reference(*args, batch.parents, 0.3, layout=layout,
                                       logits_soft_cap=cap)
        out = tree_attention(*args, batch.anc_mask, 0.3, layout=layout, logits_soft_cap=cap)
        torch.testing.assert_close(out.double(), ref, atol=ATOL[dtype], rtol=1e-2)
        exact = tree_attention(query.double(), *args[1:], batch.anc_mask, 0.3, layout=layout,
                               logits_soft_cap=cap)
        torch.testing.assert_close(exact, ref, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("layout", ["vec", "token_major"])
def test_chain_equals_causal_attention(layout):
    """A chain-shaped tree is ordinary causal decoding of the same tokens."""
    gen = torch.Generator().manual_seed(4)
    bs, hq, hkv, d = 16, 4, 2, 32
    prefixes, n = [0, 21, 32], 11
    table = random_block_table(gen, [-(-(p + n) // bs) for p in prefixes], 12, 5)
    kv = poisoned_cache(12, hkv, bs, d, torch.float32)
    kc, vc = split_kv(kv)
    chain = DraftTree.chain(1, list(range(2, n + 1)))
    batch = TreeBatch.from_trees([chain] * len(prefixes))
    queries, expected = [], []
    for r, p in enumerate(prefixes):
        k, v, q = (torch.randn(p + n, h, d, generator=gen) for h in (hkv, hkv, hq))
        write_slots(kv, logical_slots(table[r], torch.arange(p + n), bs), k, v, layout)
        o = F.scaled_dot_product_attention(          # [Hq, L, D], causal over all p + n rows
            q.transpose(0, 1), k.repeat_interleave(hq // hkv, 1).transpose(0, 1),
            v.repeat_interleave(hq // hkv, 1).transpose(0, 1), is_causal=True, scale=0.2)
        queries.append(q[p:])
        expected.append(o.transpose(0, 1)[p:])
    out = tree_attention(torch.cat(queries), kc, vc, table, torch.tensor(prefixes),
                         batch.offsets, batch.anc_mask, 0.2, layout=layout)
    torch.testing.assert_close(out, torch.cat(expected), atol=2e-5, rtol=1e-4)


def test_anc_mask_decode_covers_sign_bit():
    """Word 0 bit 63 is the int64 sign bit: rows of node >= 63 must still decode exactly."""
    tree = random_tree(np.random.default_rng(5), 140)
    batch = TreeBatch.from_trees([tree])
    assert (batch.anc_mask < 0).any()
    got = decode_anc_mask(batch.anc_mask, tree.num_nodes)
    assert torch.equal(got, torch.from_numpy(tree.dense_mask().astype(bool)))


def test_gather_paged_kv_and_layout_errors():
    gen = torch.Generator().manual_seed(6)
    kv = poisoned_cache(6, 2, 16, 32, torch.float32)
    table = torch.tensor([4, 1, 3], dtype=torch.int32)
    k, v = torch.randn(40, 2, 32, generator=gen), torch.randn(40, 2, 32, generator=gen)
    write_slots(kv, logical_slots(table, torch.arange(40), 16), k, v, "vec")
    gk, gv = gather_paged_kv(*split_kv(kv), table, 40, layout="vec")
    assert torch.equal(gk, k) and torch.equal(gv, v)
    with pytest.raises(NotImplementedError, match="supported"):
        check_layout("neon", torch.float32, 16, 32)
    with pytest.raises(ValueError, match="amx"):
        check_layout("amx", torch.float32, 32, 64)


# ---- against vLLM itself ---------------------------------------------------------------------

def _vllm_ops():
    try:
        from vllm import _custom_ops as ops
        torch.ops._C.cpu_attn_reshape_and_cache  # noqa: B018  (the CPU build's op)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"vLLM CPU ops unavailable ({type(exc).__name__}: {exc})")
    return ops


@pytest.mark.parametrize("isa,dtype,bs,d", [
    ("vec", torch.float32, 32, 64), ("vec", torch.bfloat16, 64, 128),
    ("vec16", torch.float32, 16, 80),
    pytest.param("amx", torch.bfloat16, 32, 64, marks=pytest.mark.skipif(
        not torch.cpu._is_amx_tile_supported(), reason="vLLM's amx layout needs a CPU with AMX tiles")),
])
def test_layout_round_trip_through_vllm(isa, dtype, bs, d):
    """K/V written by vLLM's cpu_attn_reshape_and_cache read back exactly by all three readers."""
    ops = _vllm_ops()
    gen = torch.Generator().manual_seed(7)
    hkv, n = 3, 3 * bs - 5
    kv = poisoned_cache(7, hkv, bs, d, dtype)
    kc, vc = split_kv(kv)
    table = torch.tensor([5, 0, 3], dtype=torch.int32)
    k = torch.randn(n, hkv, d, generator=gen).to(dtype)
    v = torch.randn(n, hkv, d, generator=gen).to(dtype)
    slots = logical_slots(table, torch.arange(n), bs)
    ops.cpu_attn_reshape_and_cache(k, v, kc, vc, slots, isa)
    gk, gv = gather_paged_kv(kc, vc, table, n, layout=isa)
    assert torch.equal(gk, k) and torch.equal(gv, v)
    idx = slot_element_offsets(slots, isa, hkv, bs, d)
    assert torch.equal(kv.view(-1)[idx[:, :, 0]], k) and torch.equal(kv.view(-1)[idx[:, :, 1]], v)
    for i in (0, bs - 1, bs, n - 1):
        rk, rv = read_slot_reference(kc, vc, int(slots[i]), isa)
        assert torch.equal(rk, k[i]) and torch.equal(rv, v[i])


@pytest.mark.parametrize("isa,dtype,d", [("vec", torch.float32, 64), ("vec", torch.bfloat16, 64),
                                         ("vec16", torch.float32, 80)])
def test_chain_matches_vllm_cpu_attention_kernel(isa, dtype, d):
    """Chain trees reproduce vLLM's own causal CPU kernel on the same paged cache."""
    ops = _vllm_ops()
    gen = torch.Generator().manual_seed(8)
    bs, hq, hkv, n, prefixes = 32, 4, 2, 6, [0, 29, 70]
    seq = torch.tensor(prefixes) + n
    table = random_block_table(gen, [-(-int(s) // bs) for s in seq], 10, 4)
    kv = torch.zeros(10, hkv, bs, 2 * d, dtype=dtype)    # vLLM's kernel reads whole blocks
    kc, vc = split_kv(kv)
    for r, s in enumerate(seq.tolist()):
        ops.cpu_attn_reshape_and_cache(torch.randn(s, hkv, d, generator=gen).to(dtype),
                                       torch.randn(s, hkv, d, generator=gen).to(dtype), kc, vc,
                                       logical_slots(table[r], torch.arange(s), bs), isa)
    query = torch.randn(n * len(prefixes), hq, d, generator=gen).to(dtype)
    qsl = torch.arange(len(prefixes) + 1, dtype=torch.int32) * n
    meta = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=len(prefixes), num_heads=hq, num_kv_heads=hkv, head_dim=d, seq_lens=seq.int(),
        dtype=dtype, query_start_loc=qsl, causal=True, sliding_window_size=-1, isa=isa,
        enable_kv_split=False)
    expected = torch.empty_like(query)
    ops.cpu_attention_with_kv_cache(
        query=query, key_cache=kc, value_cache=vc, output=expected, query_start_loc=qsl,
        seq_lens=seq.int(), scale=0.125, causal=True, alibi_slopes=None, sliding_window=-1,
        block_table=table, softcap=0.0, scheduler_metadata=meta, s_aux=None)
    batch = TreeBatch.from_trees([DraftTree.chain(1, list(range(2, n + 1)))] * len(prefixes))
    out = tree_attention(query, kc, vc, table, torch.tensor(prefixes), batch.offsets,
                         batch.anc_mask, 0.125, layout=isa)
    torch.testing.assert_close(out.float(), expected.float(), atol=ATOL[dtype], rtol=1e-2)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_any_subset_of_rows_equals_the_full_computation(seed):
    """With tree_sizes, only some rows of each tree are recomputed (the engine skips rows whose
    ancestors are exactly the rows before them); they equal the same rows of the full call."""
    sizes, prefixes = [9, 70, 20], [5, 33, 64]
    batch, table, kv, query = _case(seed, "vec", torch.float32, 16, 32, sizes, prefixes, 4, 2)
    kc, vc = split_kv(kv)
    full = tree_attention(query, kc, vc, table, torch.tensor(prefixes), batch.offsets,
                          batch.anc_mask, 0.3, layout="vec")
    rng = np.random.default_rng(seed)
    keep = [np.sort(rng.choice(n, size=max(1, n // 3), replace=False)) for n in sizes]
    rows = torch.from_numpy(np.concatenate([int(o) + k for o, k in zip(batch.offsets[:-1], keep)]))
    offsets = torch.tensor(np.concatenate([[0], np.cumsum([len(k) for k in keep])]))
    part = tree_attention(query[rows], kc, vc, table, torch.tensor(prefixes), offsets,
                          batch.anc_mask[rows], 0.3, layout="vec", tree_sizes=torch.tensor(sizes))
    torch.testing.assert_close(part, full[rows], atol=2e-5, rtol=1e-4)


def test_one_plan_serves_every_layer_and_a_stale_plan_is_refused():
    """The engine plans masks once per step and applies them per layer (different caches)."""
    sizes, prefixes = [9, 30], [5, 40]
    batch, table, kv1, query = _case(3, "vec", torch.float32, 16, 32, sizes, prefixes, 4, 2)
    kv2 = kv1 * 0.5 + 1.0                       # another layer: same slots, other values
    args = (table, torch.tensor(prefixes), batch.offsets, batch.anc_mask)
    plan = plan_tree_attention(*args, num_rows=batch.num_rows, num_q_heads=4, num_kv_heads=2,
                               head_size=32, num_blocks=kv1.shape[0], block_size=16)
    got = [apply_tree_attention(plan, query, *split_kv(kv), 0.3, layout="vec") for kv in (kv1, kv2)]
    for out, kv in zip(got, (kv1, kv2)):       # each call below makes a fresh plan
        torch.testing.assert_close(out, tree_attention(query, *split_kv(kv), *args, 0.3, layout="vec"))
    with pytest.raises(RuntimeError, match="stale"):
        apply_tree_attention(plan, query, *split_kv(kv1), 0.3, layout="vec")
