"""GPU verification kernels: tree attention latency against the alternatives, KV compaction
bandwidth against a device-to-device copy (issue 6's grid). Needs a CUDA GPU; exits with a
message (code 2) elsewhere.

Attention, per (batch, context, tree size), every request with the same prefix length and a
random tree of that size, Hq 32 / Hkv 8 (8B-class GQA), bf16, paged blocks of 16:
  tree_triton      kernels.tree_attention on the paged cache (the kernel under test)
  causal_ours      the same kernel and rows with every request flagged causal (j <= i, mask
                   words unread): what the ancestor mask itself costs
  causal_sdpa      the same number of query rows, causal (lower-right) SDPA on contiguous K/V:
                   the chain/causal path's cost at equal query tokens
  causal_vllm_fa   vLLM's FlashAttention varlen kernel on the paged cache, causal (if importable)
  sdpa_dense_mask  SDPA with a dense boolean [B, 1, n, L] mask on contiguous K/V
  flex_block_mask  FlexAttention with a BlockMask built from the tree mask (build time reported
                   separately: it is paid every step)
  flashinfer_mask  FlashInfer paged prefill with a custom mask (if flashinfer is installed)
Launch path (`--launch-shapes`): what one call costs the host (submission time per call in a
loop of 200 with no sync: the GPU runs behind, so this is the Python and launch time alone),
for the wrapper as a plain caller uses it, for the call as the serving backend makes it (split
count and split scratch made once per step and reused), and for the backend's whole per-layer
work (query gather, call, scatter); against the GPU time of the same call replayed from a CUDA
graph (no host in the way) and the host time of causal SDPA at equal rows.
Tiles (`--tune-s`): a sweep of BLOCK_M x BLOCK_N x warps x stages at a few shapes, each variant
checked against the default tiles' output before it is timed.
Compaction: 32 layers x (K, V) caches, every request moving `moves` slots (alias chains),
Triton and (if built) the CUDA op, against torch's D2D copy rate on a 1 GiB buffer.

    python benchmarks/bench_kernels.py                       # full grid, JSON to results/
    python benchmarks/bench_kernels.py --batches 1 8 --contexts 4096 --trees 64 --out x.json

Times are triton.testing.do_bench medians (ms). `--budget-s` skips the grid points left once
that many seconds have passed (recorded as skipped), so a leased GPU run ends on time.
"""
from __future__ import annotations

import argparse
import functools
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

RESULTS = Path(__file__).resolve().parent / "results"


DEVICE = "cuda"          # `--smoke` switches to "cpu": the interpreter, tiny shapes, no timing value


def _bench(fn: Callable[[], Any]) -> float:
    if DEVICE != "cuda":                   # smoke run: one call, wall clock
        t = time.perf_counter()
        fn()
        return (time.perf_counter() - t) * 1e3
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=50))


def _empty_cache() -> None:
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def _try(fn: Callable[[], float]) -> float | str:
    """A time in ms, or the error text (a baseline that cannot run is reported, not faked)."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - recorded in the results
        return f"error: {type(e).__name__}: {str(e)[:200]}"


class Case:
    """One grid point: paged cache, contiguous copies, trees and masks on the GPU."""

    def __init__(self, batch: int, context: int, tree: int, hq: int, hkv: int, d: int,
                 dtype: torch.dtype, block_size: int, seed: int = 0) -> None:
        from vllm_treespec.tree import TreeBatch
        from harness.random_trees import random_tree

        rng = np.random.default_rng(seed)
        dev = torch.device(DEVICE)
        self.b, self.ctx, self.n, self.hq, self.hkv, self.d = batch, context, tree, hq, hkv, d
        self.L = context + tree
        self.scale = d ** -0.5
        trees = [random_tree(rng, tree - 1, max_children=4) for _ in range(batch)]
        tb = TreeBatch.from_trees(trees)
        self.offsets = tb.offsets.to(dev)
        self.anc_mask = tb.anc_mask.to(dev)
        self.parents = tb.parents
        self.prefix = torch.full((batch,), context, dtype=torch.int64, device=dev)
        blocks = -(-self.L // block_size)
        perm = torch.randperm(batch * blocks, device=dev)
        self.block_table = perm.view(batch, blocks).to(torch.int32)
        self.k_contig = torch.randn(batch, hkv, self.L, d, device=dev, dtype=dtype)
        self.v_contig = torch.randn(batch, hkv, self.L, d, device=dev, dtype=dtype)
        self.key_cache = torch.empty(batch * blocks, block_size, hkv, d, device=dev, dtype=dtype)
        self.value_cache = torch.empty_like(self.key_cache)
        pos = torch.arange(self.L, device=dev)
        for r in range(batch):
            blk = self.block_table[r].long()[pos // block_size]
            self.key_cache[blk, pos % block_size] = self.k_contig[r].transpose(0, 1)
            self.value_cache[blk, pos % block_size] = self.v_contig[r].transpose(0, 1)
        self.q = torch.randn(batch * tree, hq, d, device=dev, dtype=dtype)
        self.q_bhnd = self.q.view(batch, tree, hq, d).transpose(1, 2)
        bits = (tb.anc_mask.unsqueeze(-1) >> torch.arange(64)) & 1
        tree_mask = bits.flatten(1)[:, :tree].bool().view(batch, tree, tree).to(dev)
        self.tree_mask = tree_mask
        self.dense = torch.cat([torch.ones(batch, tree, context, dtype=torch.bool, device=dev),
                                tree_mask], dim=2).unsqueeze(1)          # [B, 1, n, L]

    def check_first_request(self) -> float:
        """Max |ours - float64 reference| over request 0's rows (a sanity check per point)."""
        from harness.kernel_reference import paged_tree_attention_reference

        ours = self.tree_triton()[: self.n].double()
        parents = self.parents[: self.n]
        ref = paged_tree_attention_reference(self.q[: self.n], self.key_cache, self.value_cache,
                                             self.block_table[:1], self.prefix[:1],
                                             self.offsets[:2], parents, self.scale)
        return float((ours - ref).abs().max())

    @staticmethod
    def bytes_needed(batch: int, context: int, tree: int, hq: int, hkv: int, d: int,
                     itemsize: int) -> int:
        kv = 4 * batch * (context + tree) * hkv * d * itemsize      # paged + contiguous, K and V
        return kv + batch * tree * (context + tree) + 4 * batch * tree * hq * d * itemsize

    def tree_triton(self, **tiles: int) -> torch.Tensor:
        from vllm_treespec.kernels.tree_attention import paged_tree_attention

        return paged_tree_attention(self.q, self.key_cache, self.value_cache, self.block_table,
                                    self.prefix, self.offsets, self.anc_mask, self.scale,
                                    max_rows=self.n, max_prefix=self.ctx, **tiles)

    def tree_backend_call(self) -> Callable[..., torch.Tensor]:
        """The call as engine/tree_attention_triton.py makes it: split count and scratch made
        once (per step there), so the call allocates nothing but its output."""
        from vllm_treespec.kernels.tree_attention import (default_num_splits,
                                                          paged_tree_attention, split_workspace)

        splits = default_num_splits(self.q, self.hkv, self.b, self.n, self.ctx)
        ws = split_workspace(splits, *self.q.shape, self.q.device)
        return lambda q=self.q, out=None: paged_tree_attention(
            q, self.key_cache, self.value_cache, self.block_table, self.prefix,
            self.offsets, self.anc_mask, self.scale, max_rows=self.n, max_prefix=self.ctx,
            num_splits=splits, workspace=ws, out=out)

    def backend_layer(self) -> Callable[[], Any]:
        """The backend's per-layer work: gather the tree rows' queries out of the step's query
        rows (a few plain rows around them), the call, scatter the result back."""
        call = self.tree_backend_call()
        step_q = torch.randn(self.q.shape[0] + 8, *self.q.shape[1:], device=self.q.device,
                             dtype=self.q.dtype)
        rows = torch.arange(4, 4 + self.q.shape[0], device=self.q.device)
        return lambda: step_q.index_copy_(0, rows, call(step_q[rows]))

    def causal_ours(self) -> torch.Tensor:
        from vllm_treespec.kernels.tree_attention import paged_tree_attention

        causal = torch.ones(self.b, dtype=torch.int32, device=self.q.device)
        return paged_tree_attention(self.q, self.key_cache, self.value_cache, self.block_table,
                                    self.prefix, self.offsets, self.anc_mask, self.scale,
                                    causal=causal, max_rows=self.n, max_prefix=self.ctx)

    def causal_sdpa(self) -> torch.Tensor:
        from torch.nn.attention.bias import causal_lower_right

        bias = causal_lower_right(self.n, self.L)
        return torch.nn.functional.scaled_dot_product_attention(
            self.q_bhnd, self.k_contig, self.v_contig, attn_mask=bias, scale=self.scale,
            enable_gqa=True)

    def sdpa_dense_mask(self) -> torch.Tensor:
        return torch.nn.functional.scaled_dot_product_attention(
            self.q_bhnd, self.k_contig, self.v_contig, attn_mask=self.dense, scale=self.scale,
            enable_gqa=True)

    def causal_vllm_fa(self) -> Callable[[], torch.Tensor]:
        from vllm.vllm_flash_attn import flash_attn_varlen_func

        dev = self.q.device
        cu_q = torch.arange(0, (self.b + 1) * self.n, self.n, dtype=torch.int32, device=dev)
        seqused = torch.full((self.b,), self.L, dtype=torch.int32, device=dev)
        return lambda: flash_attn_varlen_func(
            q=self.q, k=self.key_cache, v=self.value_cache, max_seqlen_q=self.n,
            cu_seqlens_q=cu_q, max_seqlen_k=self.L, seqused_k=seqused, softmax_scale=self.scale,
            causal=True, block_table=self.block_table)

    def flex(self) -> tuple[Callable[[], Any], Callable[[], torch.Tensor]]:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention

        tree_mask, ctx = self.tree_mask, self.ctx

        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx < ctx) | tree_mask[b, q_idx, (kv_idx - ctx).clamp(min=0)]

        build = lambda: create_block_mask(mask_mod, self.b, None, self.n, self.L,  # noqa: E731
                                          device=DEVICE)
        block_mask = build()
        attn = torch.compile(flex_attention)
        run = lambda: attn(self.q_bhnd, self.k_contig, self.v_contig,  # noqa: E731
                           block_mask=block_mask, scale=self.scale, enable_gqa=True)
        return build, run

    def flashinfer(self) -> Callable[[], torch.Tensor]:
        import flashinfer

        dev = self.q.device
        bs = self.key_cache.shape[1]
        blocks = self.block_table.shape[1]
        ws = torch.empty(256 << 20, dtype=torch.uint8, device=dev)
        wrapper = flashinfer.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
        qo_indptr = torch.arange(0, (self.b + 1) * self.n, self.n, dtype=torch.int32, device=dev)
        kv_indptr = torch.arange(0, (self.b + 1) * blocks, blocks, dtype=torch.int32, device=dev)
        last = torch.full((self.b,), self.L - (blocks - 1) * bs, dtype=torch.int32, device=dev)
        mask = self.dense[:, 0].reshape(-1)
        wrapper.plan(qo_indptr, kv_indptr, self.block_table.reshape(-1), last, self.hq,
                     self.hkv, self.d, bs, custom_mask=mask, q_data_type=self.q.dtype,
                     kv_data_type=self.key_cache.dtype, sm_scale=self.scale)
        return lambda: wrapper.run(self.q, (self.key_cache, self.value_cache))


def attention_row(case: Case, methods: set[str]) -> dict[str, Any]:
    row: dict[str, Any] = {"batch": case.b, "context": case.ctx, "tree": case.n}
    row["max_abs_diff_req0_vs_fp64"] = _try(case.check_first_request)
    row["tree_triton_ms"] = _try(lambda: _bench(case.tree_triton))
    if "causal_ours" in methods:
        row["causal_ours_ms"] = _try(lambda: _bench(case.causal_ours))
    if "causal_sdpa" in methods:
        row["causal_sdpa_ms"] = _try(lambda: _bench(case.causal_sdpa))
    if "causal_vllm_fa" in methods:
        row["causal_vllm_fa_ms"] = _try(lambda: _bench(case.causal_vllm_fa()))
    if "sdpa_dense_mask" in methods:
        row["sdpa_dense_mask_ms"] = _try(lambda: _bench(case.sdpa_dense_mask))
    if "flex_block_mask" in methods:
        try:
            build, run = case.flex()
            row["flex_block_mask_ms"] = _try(lambda: _bench(run))
            row["flex_mask_build_ms"] = _try(lambda: _bench(build))
        except Exception as e:  # noqa: BLE001
            row["flex_block_mask_ms"] = f"error: {type(e).__name__}: {str(e)[:200]}"
    if "flashinfer_mask" in methods:
        row["flashinfer_mask_ms"] = _try(lambda: _bench(case.flashinfer()))
    for base in ("causal_ours_ms", "causal_sdpa_ms", "causal_vllm_fa_ms", "sdpa_dense_mask_ms",
                 "flex_block_mask_ms", "flashinfer_mask_ms"):
        if isinstance(row.get(base), float) and isinstance(row["tree_triton_ms"], float):
            row[f"tree_over_{base[:-3]}"] = row["tree_triton_ms"] / row[base]
    return row


def host_us(fn: Callable[[], Any], calls: int = 200, until_done: bool = False) -> float:
    """Time per call (µs) of `calls` back-to-back calls: the host's alone (no sync inside the
    timed loop), or with `until_done` up to the GPU's end of the last call (the pace of an eager
    layer loop, whichever of host and GPU is slower)."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    if until_done:
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t
    torch.cuda.synchronize()
    return elapsed / calls * 1e6


def graph_ms(fn: Callable[[], Any], per_graph: int = 10, replays: int = 20) -> float:
    """GPU time per call (ms) of `fn` captured `per_graph` times in one CUDA graph."""
    fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(per_graph):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / (replays * per_graph)


def launch_rows(shapes: list[tuple[int, int, int]], hq: int, hkv: int, d: int,
                dtype: torch.dtype, block_size: int) -> list[dict[str, Any]]:
    rows = []
    for b, ctx, n in shapes:
        case = Case(b, ctx, n, hq, hkv, d, dtype, block_size)
        out = torch.empty_like(case.q)
        backend = functools.partial(case.tree_backend_call(), out=out)
        row: dict[str, Any] = {"batch": b, "context": ctx, "tree": n}
        row["wrapper_host_us"] = _try(lambda: host_us(case.tree_triton))
        row["backend_call_host_us"] = _try(lambda: host_us(backend))
        row["backend_layer_host_us"] = _try(lambda: host_us(case.backend_layer()))
        row["causal_sdpa_host_us"] = _try(lambda: host_us(case.causal_sdpa))
        row["eager_do_bench_ms"] = _try(lambda: _bench(backend))
        row["graph_gpu_ms"] = _try(lambda: graph_ms(backend))
        row["causal_sdpa_graph_gpu_ms"] = _try(lambda: graph_ms(case.causal_sdpa))
        rows.append(row)
        del case, backend
        _empty_cache()
    return rows


TUNE_SHAPES = ((1, 4096, 64), (8, 4096, 64), (32, 4096, 16), (8, 32768, 16))
TUNE_TILES = tuple((m, n, w, s) for m in (64, 128, 32) for n in (64, 32) for w in (8, 4)
                   for s in (2, 3))


def tune_rows(shapes: tuple[tuple[int, int, int], ...], hq: int, hkv: int, d: int,
              dtype: torch.dtype, block_size: int, seconds: float) -> list[dict[str, Any]]:
    """Tile variants at each shape (an equal share of `seconds` each): error against the
    default tiles' output, then time."""
    rows = []
    for b, ctx, n in shapes:
        deadline = time.monotonic() + seconds / len(shapes)
        case = Case(b, ctx, n, hq, hkv, d, dtype, block_size, seed=1)
        want = case.tree_triton().float()
        for bm, bn, warps, stages in TUNE_TILES:
            if time.monotonic() > deadline:
                rows.append({"batch": b, "context": ctx, "tree": n, "skipped": "budget"})
                break
            tiles = dict(block_m=bm, block_n=bn, num_warps=warps, num_stages=stages)
            row: dict[str, Any] = {"batch": b, "context": ctx, "tree": n, **tiles}
            try:
                got = case.tree_triton(**tiles).float()
                row["max_abs_diff_vs_default"] = float((got - want).abs().max())
                row["ms"] = _bench(lambda: case.tree_triton(**tiles))
            except Exception as e:  # noqa: BLE001 - a variant that fails to compile is data
                row["error"] = f"{type(e).__name__}: {str(e)[:160]}"
            rows.append(row)
        del case
        _empty_cache()
    return rows


def d2d_gbps() -> float:
    """torch copy_ between two 1 GiB buffers: bytes read + written per second, GB/s."""
    a = torch.empty(1 << 30, dtype=torch.uint8, device=DEVICE)
    b = torch.empty_like(a)
    ms = _bench(lambda: b.copy_(a))
    return 2 * a.numel() / (ms * 1e-3) / 1e9


def compaction_rows(batches: list[int], moves: int, layers: int, hkv: int, d: int,
                    dtype: torch.dtype, block_size: int) -> list[dict[str, Any]]:
    from vllm_treespec.kernels import cuda_ops
    from vllm_treespec.kernels.kv_compaction import KVLayers, compact_kv

    rows = []
    for b in batches:
        span = moves + 2
        blocks = -(-b * span // block_size) + 1
        caches = [torch.randn(2, blocks, block_size, hkv, d, device=DEVICE).to(dtype)
                  for _ in range(layers)]
        kv = KVLayers.from_caches(caches)
        base = torch.arange(b, device=DEVICE)[:, None] * span
        j = torch.arange(1, moves + 1, device=DEVICE)[None, :]
        src, dst = base + j + 1, base + j              # alias chain: node j+1 -> slot j
        nbytes = 2 * b * moves * 2 * layers * hkv * d * caches[0].element_size()  # read+write
        row: dict[str, Any] = {"batch": b, "moves_per_request": moves, "layers": layers}
        ms = _bench(lambda: compact_kv(kv, src, dst))
        row.update(triton_ms=ms, triton_gbps=nbytes / (ms * 1e-3) / 1e9)
        if cuda_ops.available():
            ms = _bench(lambda: cuda_ops.compact_kv(kv, src, dst))
            row.update(cuda_ms=ms, cuda_gbps=nbytes / (ms * 1e-3) / 1e9)
        rows.append(row)
        del caches, kv
        _empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32, 128])
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 4096, 32768])
    p.add_argument("--trees", type=int, nargs="+", default=[16, 64, 256])
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--heads", type=int, nargs=2, default=[32, 8], metavar=("HQ", "HKV"))
    p.add_argument("--dtype", choices=["bfloat16", "float16"], default="bfloat16")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-gib", type=float, default=None,
                   help="skip grid points needing more (default: 80%% of free GPU memory)")
    p.add_argument("--methods", nargs="+", default=["causal_ours", "causal_sdpa",
                   "causal_vllm_fa", "sdpa_dense_mask", "flex_block_mask", "flashinfer_mask"])
    p.add_argument("--flex-contexts", type=int, nargs="*", default=None,
                   help="contexts at which to run FlexAttention (each new shape recompiles it; "
                        "default: all)")
    p.add_argument("--tune-s", type=float, default=0.0,
                   help="seconds for a sweep of tile variants at TUNE_SHAPES (0: none)")
    p.add_argument("--budget-s", type=float, default=None,
                   help="skip the grid points left after this many seconds")
    p.add_argument("--launch-shapes", nargs="*", default=["1x4096x16", "1x4096x64", "1x16384x64",
                   "8x4096x64", "32x4096x16"], metavar="BxCTXxTREE",
                   help="points for the launch-path rows (none: skip them)")
    p.add_argument("--compaction-moves", type=int, default=8)
    p.add_argument("--compaction-batches", type=int, nargs="+", default=[1, 8, 32, 128, 512],
                   help="requests per compaction (large ones show the bandwidth, small ones "
                        "the launch floor)")
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--smoke", action="store_true",
                   help="CPU, Triton interpreter, whatever shapes are given: checks that the "
                        "script runs (times mean nothing); TRITON_INTERPRET=1 must be set")
    ns = p.parse_args(argv)
    global DEVICE
    if ns.smoke:
        DEVICE = "cpu"
        return _main(ns)
    if not torch.cuda.is_available():
        print("bench_kernels.py needs a CUDA GPU (torch.cuda.is_available() is False); "
              "nothing was measured.", file=sys.stderr)
        return 2
    return _main(ns)


def _gpu_info() -> dict[str, Any]:
    if DEVICE != "cuda":
        return {"name": "cpu (smoke run: Triton interpreter, times meaningless)"}
    props = torch.cuda.get_device_properties(0)
    return {"name": props.name, "capability": f"{props.major}.{props.minor}",
            "sms": props.multi_processor_count, "memory_gib": round(props.total_memory / 2**30, 1)}


def _main(ns: argparse.Namespace) -> int:
    from harness.report import software_info

    dtype = getattr(torch, ns.dtype)
    hq, hkv = ns.heads
    free = torch.cuda.mem_get_info()[0] if DEVICE == "cuda" else 8 * 2**30
    budget = (ns.max_gib * 2**30) if ns.max_gib else 0.8 * free
    methods = set(ns.methods)

    start = time.monotonic()
    deadline = start + (ns.budget_s or float("inf"))
    rows: list[dict[str, Any]] = []
    print(f"{'B':>4} {'ctx':>6} {'tree':>5} {'ours ms':>8} {'ourcaus':>8} {'causal':>8} "
          f"{'dense':>8} {'flex':>8} {'finfer':>8}")
    for b in ns.batches:
        for ctx in ns.contexts:
            for n in ns.trees:
                need = Case.bytes_needed(b, ctx, n, hq, hkv, ns.head_dim, dtype.itemsize)
                if need > budget:
                    rows.append({"batch": b, "context": ctx, "tree": n,
                                 "skipped": f"needs ~{need / 2**30:.1f} GiB"})
                    continue
                if time.monotonic() > deadline:
                    rows.append({"batch": b, "context": ctx, "tree": n, "skipped": "budget"})
                    continue
                case = Case(b, ctx, n, hq, hkv, ns.head_dim, dtype, ns.block_size)
                flex_here = ns.flex_contexts is None or ctx in ns.flex_contexts
                row = attention_row(case, methods if flex_here else methods - {"flex_block_mask"})
                rows.append(row)
                del case
                _empty_cache()
                f = lambda k: (f"{row[k]:8.3f}" if isinstance(row.get(k), float)  # noqa: E731
                               else f"{'-':>8}")
                print(f"{b:>4} {ctx:>6} {n:>5} {f('tree_triton_ms')} {f('causal_ours_ms')} "
                      f"{f('causal_sdpa_ms')} "
                      f"{f('sdpa_dense_mask_ms')} {f('flex_block_mask_ms')} "
                      f"{f('flashinfer_mask_ms')}", flush=True)
    shapes = TUNE_SHAPES if not ns.smoke else ((1, 32, 16),)
    tuning = (tune_rows(shapes, hq, hkv, ns.head_dim, dtype, ns.block_size, ns.tune_s)
              if ns.tune_s > 0 else [])
    for r in sorted((r for r in tuning if "ms" in r), key=lambda r: r["ms"])[:8]:
        print(f"tune B={r['batch']} ctx={r['context']} tree={r['tree']}: {r['block_m']}x"
              f"{r['block_n']} w{r['num_warps']} s{r['num_stages']} {r['ms']:.4f} ms")
    launch = (launch_rows([tuple(int(x) for x in s.split("x")) for s in ns.launch_shapes],
                          hq, hkv, ns.head_dim, dtype, ns.block_size)
              if DEVICE == "cuda" and ns.launch_shapes else [])
    for r in launch:
        f = lambda k: (f"{r[k]:.4g}" if isinstance(r.get(k), float) else str(r.get(k)))  # noqa: E731
        print(f"launch B={r['batch']} ctx={r['context']} tree={r['tree']}: host us wrapper "
              f"{f('wrapper_host_us')} backend call {f('backend_call_host_us')} layer "
              f"{f('backend_layer_host_us')} sdpa {f('causal_sdpa_host_us')}; eager "
              f"{f('eager_do_bench_ms')} ms, graph {f('graph_gpu_ms')} ms (sdpa graph "
              f"{f('causal_sdpa_graph_gpu_ms')} ms)", flush=True)
    d2d = d2d_gbps() if DEVICE == "cuda" else float("nan")
    comp = compaction_rows(ns.compaction_batches, ns.compaction_moves, 32, hkv, ns.head_dim, dtype,
                           ns.block_size)
    print(f"D2D copy: {d2d:.0f} GB/s")
    for r in comp:
        print(f"compaction B={r['batch']:>4}: triton {r['triton_ms']:.4f} ms "
              f"({r['triton_gbps']:.0f} GB/s, {r['triton_gbps'] / d2d:.0%} of D2D)")
    gpu = _gpu_info()
    import triton

    record = {"benchmark": "bench_kernels", "gpu": gpu,
              "software": software_info() | {"triton": triton.__version__},
              "settings": {"hq": hq, "hkv": hkv, "head_dim": ns.head_dim, "dtype": ns.dtype,
                           "block_size": ns.block_size, "timer": "triton.testing.do_bench median"},
              "attention": rows, "launch": launch, "tuning": tuning, "d2d_copy_gbps": d2d,
              "compaction": comp,
              "seconds": time.monotonic() - start}
    out = ns.out or RESULTS / f"bench_kernels_{gpu['name'].replace(' ', '_')}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
