"""Paged tree attention for verification rows (Triton), over vLLM's CUDA paged KV layout.

Why a dedicated kernel: a draft tree's rows need the whole prefix unmasked plus a tree mask over
a few hundred keys at most. A dense float mask (SDPA, FlexAttention) grows with the context and
FlashInfer's custom mask forgoes its fast paths; here the prefix is plain flash attention and the
tree part reads one 64-bit ancestor word per row and key tile.

Layout (vLLM FlashAttention backend): ``key_cache`` / ``value_cache`` are
``[num_blocks, block_size, Hkv, D]`` (the two halves of its ``kv_cache[2, ...]``; any strides
with a contiguous head dim). Request r's tree rows are query rows
``q_offsets[r] .. q_offsets[r+1]-1`` (node order, root first); node i's K/V are already in the
cache at logical position ``prefix_lens[r] + i``. Row i sees every prefix key and tree key j
iff bit j of its ancestor-or-self mask is set (``anc_mask`` int64 ``[T, W]``, word j // 64, bit
j % 64, as in ``vllm_treespec.tree.batch``). A request flagged in ``causal`` ignores the mask and
sees keys j <= i instead (ordinary decode/prefill/chain rows; a decode row is also just a
1-node tree).

Work split: grid ``(row tiles, B * Hkv, splits)``. A program owns BLOCK_M (tree row, query head)
pairs of one request and one KV head (the GQA group is packed into M, so K/V tiles are loaded
once per group), one contiguous chunk of the prefix (flash-decoding split-KV), and, in the last
split, the tree keys up to its largest row (ancestors always precede a node). With several
splits each program writes a normalised partial output and its log2-sum-exp; a second kernel
merges them. With one split the first kernel writes the output directly.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

__all__ = ["paged_tree_attention", "choose_num_splits", "default_config", "split_workspace"]

_LOG2E = 1.4426950408889634


@triton.jit
def _mm(a, b, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    # UPCAST is only set under TRITON_INTERPRET for bf16: the interpreter's dot multiplies the
    # raw uint16 bit patterns of bf16 operands (triton 3.9). Values are exact in float32.
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
    return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _load_kv(K, V, bt_row, pos, ok, kv_head, d, d_ok,
             stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
             BLOCK_SIZE: tl.constexpr):
    blk = tl.load(bt_row + pos // BLOCK_SIZE, mask=ok, other=0).to(tl.int64)
    off = (pos % BLOCK_SIZE).to(tl.int64)
    m2 = ok[:, None] & d_ok[None, :]
    k = tl.load(K + (blk * stride_kb + off * stride_ks + kv_head * stride_kh)[:, None] + d[None, :],
                mask=m2, other=0.0)
    v = tl.load(V + (blk * stride_vb + off * stride_vs + kv_head * stride_vh)[:, None] + d[None, :],
                mask=m2, other=0.0)
    return k, v


@triton.jit
def _scores(q, k, sm_scale, soft_cap, SOFT_CAP: tl.constexpr, UPCAST: tl.constexpr,
            PRECISION: tl.constexpr):
    """q k^T in log2 units (scaled by sm_scale * log2(e), soft-capped first when asked)."""
    s = _mm(q, tl.trans(k), UPCAST, PRECISION)
    if SOFT_CAP:
        x = s * (sm_scale / soft_cap)
        s = (soft_cap * 1.4426950408889634) * (2.0 * tl.sigmoid(2.0 * x) - 1.0)  # cap*tanh(x)
    else:
        s = s * (sm_scale * 1.4426950408889634)
    return s


@triton.jit
def _online_update(m_i, l_i, acc, s, v, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_use = tl.where(m_new == float("-inf"), 0.0, m_new)   # fully masked so far: no NaN
    alpha = tl.exp2(m_i - m_use)
    p = tl.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + _mm(p.to(v.dtype), v, UPCAST, PRECISION)
    return m_new, l_i, acc


@triton.jit
def _tree_attn_kernel(
    Q, K, V, Out, PartOut, PartLse,
    block_table, prefix_lens, q_offsets, anc_mask, causal,
    sm_scale, soft_cap, num_kv_heads, num_words,
    stride_qt, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    stride_ot, stride_oh,
    stride_ps, stride_pt, stride_ph,
    stride_ls, stride_lt,
    stride_bt, stride_am,
    BLOCK_SIZE: tl.constexpr, GROUP: tl.constexpr, HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, HAS_CAUSAL: tl.constexpr, SOFT_CAP: tl.constexpr,
    UPCAST: tl.constexpr, PRECISION: tl.constexpr,
):
    tile = tl.program_id(0)
    req = tl.program_id(1) // num_kv_heads
    kv_head = tl.program_id(1) % num_kv_heads
    split = tl.program_id(2)
    split64 = split.to(tl.int64)     # partial buffers can pass 2**31 elements
    q_start = tl.load(q_offsets + req).to(tl.int64)
    n_rows = (tl.load(q_offsets + req + 1).to(tl.int64) - q_start).to(tl.int32)
    if tile * BLOCK_M >= n_rows * GROUP:
        return

    m = tile * BLOCK_M + tl.arange(0, BLOCK_M)
    row = m // GROUP
    head = kv_head * GROUP + m % GROUP
    row_ok = row < n_rows
    t = q_start + row
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    io_mask = row_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + (t * stride_qt + head * stride_qh)[:, None] + d[None, :], mask=io_mask,
                other=0.0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    bt_row = block_table + req.to(tl.int64) * stride_bt
    prefix = tl.load(prefix_lens + req).to(tl.int32)

    # Prefix: every row sees every key; this split's chunk only.
    chunk = tl.cdiv(tl.cdiv(prefix, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * chunk
    hi = tl.minimum(lo + chunk, prefix)
    for start in range(lo, hi, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        ok = pos < hi
        k, v = _load_kv(K, V, bt_row, pos, ok, kv_head, d, d_ok, stride_kb, stride_ks,
                        stride_kh, stride_vb, stride_vs, stride_vh, BLOCK_SIZE)
        s = _scores(q, k, sm_scale, soft_cap, SOFT_CAP, UPCAST, PRECISION)
        s = tl.where(ok[None, :], s, float("-inf"))
        m_i, l_i, acc = _online_update(m_i, l_i, acc, s, v, UPCAST, PRECISION)

    # Tree keys (last split): keys past the tile's largest row are nobody's ancestor.
    if split == NUM_SPLITS - 1:
        last_row = (tl.minimum(tile * BLOCK_M + BLOCK_M, n_rows * GROUP) - 1) // GROUP
        n_keys = last_row + 1
        if HAS_CAUSAL:
            causal_flag = tl.load(causal + req)
        for j0 in range(0, n_keys, BLOCK_N):
            j = j0 + tl.arange(0, BLOCK_N)
            ok = j < n_keys
            k, v = _load_kv(K, V, bt_row, prefix + j, ok, kv_head, d, d_ok, stride_kb,
                            stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, BLOCK_SIZE)
            s = _scores(q, k, sm_scale, soft_cap, SOFT_CAP, UPCAST, PRECISION)
            word = j0 // 64                       # BLOCK_N divides 64: one word per row
            w_ok = row_ok & ((row * 0 + word) < num_words)
            if HAS_CAUSAL:
                w_ok = w_ok & (row * 0 + causal_flag == 0)
            bits = tl.load(anc_mask + t * stride_am + word, mask=w_ok, other=0)
            shift = (j0 % 64 + tl.arange(0, BLOCK_N)).to(tl.int64)
            vis = ((bits[:, None] >> shift[None, :]) & 1) != 0
            if HAS_CAUSAL:
                vis = tl.where(causal_flag != 0, j[None, :] <= row[:, None], vis)
            vis = vis & ok[None, :] & row_ok[:, None]
            s = tl.where(vis, s, float("-inf"))
            m_i, l_i, acc = _online_update(m_i, l_i, acc, s, v, UPCAST, PRECISION)

    if NUM_SPLITS == 1:
        out = acc / tl.where(l_i == 0.0, 1.0, l_i)[:, None]   # 0 only on padding rows
        tl.store(Out + (t * stride_ot + head * stride_oh)[:, None] + d[None, :],
                 out.to(Out.dtype.element_ty), mask=io_mask)
    else:
        empty = l_i == 0.0             # an empty prefix chunk
        l_safe = tl.where(empty, 1.0, l_i)
        tl.store(PartOut + split64 * stride_ps + (t * stride_pt + head * stride_ph)[:, None]
                 + d[None, :], acc / l_safe[:, None], mask=io_mask)
        lse = tl.where(empty, float("-inf"), m_i + tl.log2(l_safe))
        tl.store(PartLse + split64 * stride_ls + t * stride_lt + head, lse, mask=row_ok)


@triton.jit
def _merge_kernel(PartOut, PartLse, Out,
                  stride_ps, stride_pt, stride_ph, stride_ls, stride_lt, stride_ot, stride_oh,
                  NUM_SPLITS: tl.constexpr, BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr,
                  BLOCK_D: tl.constexpr):
    """out = sum_s 2^(lse_s - max) * out_s / sum_s 2^(lse_s - max) for one (row, head)."""
    t = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1)
    s = tl.arange(0, BLOCK_S).to(tl.int64)
    s_ok = s < NUM_SPLITS
    d = tl.arange(0, BLOCK_D)
    d_ok = d < HEAD_DIM
    lse = tl.load(PartLse + s * stride_ls + t * stride_lt + h, mask=s_ok, other=float("-inf"))
    w = tl.exp2(lse - tl.max(lse, 0))   # the last split (tree) is never empty: max is finite
    o = tl.load(PartOut + s[:, None] * stride_ps + t * stride_pt + h * stride_ph + d[None, :],
                mask=s_ok[:, None] & d_ok[None, :], other=0.0)
    out = tl.sum(w[:, None] * o, 0) / tl.sum(w, 0)
    tl.store(Out + t * stride_ot + h * stride_oh + d, out.to(Out.dtype.element_ty), mask=d_ok)


_TRITON_39 = tuple(int(x) for x in triton.__version__.split(".")[:2]) >= (3, 9)


def default_config(head_dim: int, dtype: torch.dtype) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps, num_stages).

    Head dim 128 in 16-bit: 64x64 tiles with 4 warps, 3 stages, the fastest variant of the tile
    sweep on an H100 with triton 3.6 (0.17 ms against 0.30 ms for 8 warps at 8 requests x 4096
    keys x 64 nodes; the "tuning" rows of benchmarks/results/bench_kernels_H100_8warps.json and
    bench_kernels_H100.json, NOTES.md). Triton 3.9's sm_90 compile reports register spills for
    that variant (compile_check.py), and
    it has not run on a GPU, so with triton >= 3.9 the spill-free 8 warps stay the default.
    Other head dims and fp32 are compile-checked starting points, not tuned on hardware.
    """
    if dtype == torch.float32:
        return 32, 32, 4, 3
    if head_dim <= 64:
        return 64, 64, 4, 3
    if head_dim <= 128:
        return 64, 64, (8 if _TRITON_39 else 4), 3
    return 64, 32, 8, 2


def choose_num_splits(num_programs: int, max_prefix: int, num_sms: int, block_n: int,
                      min_chunk: int = 512, max_splits: int = 32) -> int:
    """Prefix splits so that small batches still fill the GPU (flash-decoding).

    One split when the row tiles alone give a wave of programs or the prefix is short; otherwise
    enough splits for about two waves, each chunk at least ``min_chunk`` keys. Rounded down to a
    power of two so that few kernel variants get compiled.
    """
    if num_programs >= num_sms or max_prefix < 2 * min_chunk:
        return 1
    want = min(max_splits, max_prefix // max(min_chunk, block_n),
               -(-2 * num_sms // max(num_programs, 1)))
    return 1 << (max(want, 1).bit_length() - 1)


def default_num_splits(query: torch.Tensor, num_kv_heads: int, num_requests: int, max_rows: int,
                       max_prefix: int, block_m: int | None = None,
                       block_n: int | None = None) -> int:
    """The prefix splits `paged_tree_attention` picks for a call of this shape when not given:
    1 off CUDA, else `choose_num_splits` over its grid (callers that reuse one shape in every
    layer can compute it once). block_m / block_n: the call's tiles (default_config's)."""
    if not query.is_cuda:
        return 1
    bm, bn, _, _ = default_config(triton.next_power_of_2(query.shape[-1]), query.dtype)
    tiles = triton.cdiv(max_rows * (query.shape[1] // num_kv_heads), block_m or bm)
    sms = _sm_count(query.device.index if query.device.index is not None
                    else torch.cuda.current_device())
    return choose_num_splits(tiles * num_requests * num_kv_heads, max_prefix, sms, block_n or bn)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    """Multiprocessors of a CUDA device (asked once: the query sits on the host launch path)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def split_workspace(num_splits: int, num_rows: int, num_heads: int, head_dim: int,
                    device: torch.device | str) -> torch.Tensor | None:
    """The float32 scratch of a split call (partial outputs and their log-sum-exps), or None
    for one split. A caller that runs the same shape in every layer allocates it once per step
    and passes it as ``workspace=``: the layers run one after another on one stream, and the
    wrapper then allocates nothing (fewer host operations per call, and an address that stays
    put under a CUDA graph)."""
    if num_splits <= 1:
        return None
    return torch.empty(_workspace_numel(num_splits, num_rows, num_heads, head_dim),
                       dtype=torch.float32, device=device)


def _workspace_numel(num_splits: int, num_rows: int, num_heads: int, head_dim: int) -> int:
    """Partial outputs [S, T, Hq, D] then their log-sum-exps [S, T, Hq], float32."""
    return num_splits * num_rows * num_heads * (head_dim + 1)


def _check(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
           block_table: torch.Tensor, anc_mask: torch.Tensor, block_n: int) -> None:
    if query.dim() != 3 or key_cache.dim() != 4 or value_cache.shape != key_cache.shape:
        raise ValueError("query must be [T, Hq, D] and key/value caches "
                         "[num_blocks, block_size, Hkv, D] of one shape")
    t, hq, d = query.shape
    hkv, dk = key_cache.shape[2], key_cache.shape[3]
    if dk != d or hq % hkv:
        raise ValueError(f"query [T, {hq}, {d}] does not fit a cache with {hkv} KV heads of {dk}")
    if query.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        raise NotImplementedError(f"query dtype {query.dtype} (fp16, bf16, fp32 supported)")
    if key_cache.dtype != query.dtype or value_cache.dtype != query.dtype:
        raise NotImplementedError("the KV cache must have the query's dtype (no fp8 KV yet)")
    for name, x in (("query", query), ("key_cache", key_cache), ("value_cache", value_cache)):
        if x.stride(-1) != 1:
            raise ValueError(f"{name} needs a contiguous head dim")
    if anc_mask.dtype != torch.int64 or anc_mask.dim() != 2 or anc_mask.shape[0] != t:
        raise ValueError(f"anc_mask must be int64 [T={t}, W], got {anc_mask.dtype} "
                         f"{tuple(anc_mask.shape)}")
    if anc_mask.shape[1] > 0 and anc_mask.stride(1) != 1:
        raise ValueError("anc_mask needs contiguous words per row")
    if block_table.dim() != 2:
        raise ValueError("block_table must be [B, max_blocks]")
    if block_n not in (16, 32, 64):
        raise ValueError("block_n must be 16, 32 or 64 (one mask word per key tile)")


def paged_tree_attention(query: torch.Tensor, key_cache: torch.Tensor,
                         value_cache: torch.Tensor, block_table: torch.Tensor,
                         prefix_lens: torch.Tensor, q_offsets: torch.Tensor,
                         anc_mask: torch.Tensor, scale: float, *,
                         causal: torch.Tensor | None = None,
                         logits_soft_cap: float | None = None,
                         max_rows: int | None = None, max_prefix: int | None = None,
                         num_splits: int | None = None, block_m: int | None = None,
                         block_n: int | None = None, num_warps: int | None = None,
                         num_stages: int | None = None, out: torch.Tensor | None = None,
                         workspace: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of every tree row over its request's prefix and its ancestors-or-self.

    query: ``[T, Hq, D]`` (fp16/bf16/fp32, head h reads KV head ``h // (Hq // Hkv)``);
    key_cache / value_cache: ``[num_blocks, block_size, Hkv, D]`` in the query dtype;
    block_table: int32/int64 ``[B, max_blocks]``; prefix_lens: int ``[B]`` committed tokens
    before each tree; q_offsets: int ``[B+1]`` (its diffs are the tree sizes, >= 1 each);
    anc_mask: int64 ``[T, W]`` (rows of ``causal`` requests are not read); causal: optional
    bool/int ``[B]``; logits_soft_cap: vLLM's ``cap * tanh(s / cap)``.
    max_rows / max_prefix: upper bounds on rows per request and prefix length, which size the
    grid and the split choice; pass them (e.g. from the step's budget) to avoid a host sync and
    for CUDA graphs. num_splits: prefix splits (default: 1 on CPU, ``choose_num_splits`` on GPU).
    block_m / block_n / num_warps / num_stages override ``default_config`` (tile tuning).
    workspace: ``split_workspace(num_splits, T, Hq, D)`` or larger, reused across calls (else
    allocated per call when num_splits > 1).
    Returns ``out`` (or a new tensor) ``[T, Hq, D]`` in the query dtype.
    """
    bm, bn, warps, stages = default_config(triton.next_power_of_2(query.shape[-1]), query.dtype)
    block_m, block_n = block_m or bm, block_n or bn
    warps, stages = num_warps or warps, num_stages or stages
    _check(query, key_cache, value_cache, block_table, anc_mask, block_n)
    t, hq, d = query.shape
    _, bs, hkv, _ = key_cache.shape
    group = hq // hkv
    b = q_offsets.numel() - 1
    if out is None:
        out = torch.empty_like(query)
    if t == 0 or b == 0:
        return out
    if max_rows is None:
        max_rows = int((q_offsets[1:] - q_offsets[:-1]).max())
    if num_splits is None:
        if query.is_cuda and max_prefix is None:
            max_prefix = int(prefix_lens.max())
        num_splits = default_num_splits(query, hkv, b, max_rows, max_prefix or 0, block_m, block_n)
    tiles = triton.cdiv(max_rows * group, block_m)
    if num_splits > 1:
        need = _workspace_numel(num_splits, t, hq, d)
        if workspace is None:
            workspace = split_workspace(num_splits, t, hq, d, query.device)
        elif (workspace.dtype != torch.float32 or workspace.numel() < need
              or workspace.device != query.device or not workspace.is_contiguous()):
            raise ValueError(f"workspace must be contiguous float32 with >= {need} elements on "
                             f"{query.device} (split_workspace({num_splits}, {t}, {hq}, {d}))")
        part_out = workspace[:num_splits * t * hq * d].view(num_splits, t, hq, d)
        part_lse = workspace[num_splits * t * hq * d:need].view(num_splits, t, hq)
    else:
        part_out = part_lse = out          # unused
    has_causal = causal is not None
    causal_arg = causal.to(torch.int32) if has_causal else q_offsets
    upcast = (not query.is_cuda) and query.dtype == torch.bfloat16
    precision = "ieee" if query.dtype == torch.float32 else "tf32"
    block_d = triton.next_power_of_2(d)
    _tree_attn_kernel[(tiles, b * hkv, num_splits)](
        query, key_cache, value_cache, out, part_out, part_lse,
        block_table, prefix_lens, q_offsets, anc_mask, causal_arg,
        float(scale), float(logits_soft_cap or 1.0), hkv, anc_mask.shape[1],
        *query.stride()[:2], *key_cache.stride()[:3], *value_cache.stride()[:3],
        *out.stride()[:2], *part_out.stride()[:3], *part_lse.stride()[:2],
        block_table.stride(0), anc_mask.stride(0),
        BLOCK_SIZE=bs, GROUP=group, HEAD_DIM=d, BLOCK_D=block_d, BLOCK_M=block_m,
        BLOCK_N=block_n, NUM_SPLITS=num_splits, HAS_CAUSAL=has_causal,
        SOFT_CAP=bool(logits_soft_cap), UPCAST=upcast, PRECISION=precision,
        num_warps=warps, num_stages=stages,
    )
    if num_splits > 1:
        _merge_kernel[(t, hq)](
            part_out, part_lse, out, *part_out.stride()[:3], *part_lse.stride()[:2],
            *out.stride()[:2],
            NUM_SPLITS=num_splits, BLOCK_S=triton.next_power_of_2(num_splits), HEAD_DIM=d,
            BLOCK_D=block_d,
        )
    return out
