"""Tree attention over vLLM's CPU paged KV cache (plain torch; no vLLM import).

vLLM's CPU attention kernel takes no mask and returns no LSE, so the tree rows of a verification
step are recomputed here: request r's rows see its whole prefix (logical positions
``0 .. prefix_lens[r]-1``) plus the tree nodes that are ancestors-or-self of the row, whose K/V
sit at logical positions ``prefix_lens[r] + i`` (vLLM writes them to contiguous slots, while
their RoPE positions are ``prefix_lens[r] + depth``).

All requests are padded to the longest one and done in one batched masked SDPA: one indexing op
per K and V gathers the blocks and unpacks the ISA layout (plus one cast when the cache is not
in the compute dtype), one additive mask is built from the ancestor bitmask words, one attention
call runs. No Python loop runs per request or per node. Scratch memory, about
``B * L * (2 * Hkv * D + n_max * Hq / Hkv)`` compute-dtype elements (L = longest prefix + tree
rounded up to a block), is kept between calls: re-faulting fresh pages cost more than the copies.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from vllm_treespec.attention.cpu_kv_layout import (
    HalfLayout,
    check_layout,
    gather_blocks,
    half_layouts,
)

__all__ = ["gather_paged_kv", "tree_attention", "plan_tree_attention", "apply_tree_attention",
           "TreeMaskPlan", "decode_anc_mask", "release_workspace"]

_BITS = torch.arange(64, dtype=torch.int64)


class _Workspace:
    """Grow-only scratch buffers reused across calls.

    The padded K/V copies are large (8 requests x 1k tokens x 16 heads x 128 fp32 = 75 MB each)
    and CPU allocations are not cached: every fresh buffer is page-faulted in again, which costs
    several times the copy itself. Not thread-safe (one model runner per process calls this).
    """

    def __init__(self) -> None:
        self._bufs: dict[tuple[str, torch.dtype], torch.Tensor] = {}
        self.generation = 0          # bumped by every plan (its mask lives in "mask")

    def get(self, name: str, numel: int, dtype: torch.dtype) -> torch.Tensor:
        buf = self._bufs.get((name, dtype))
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=dtype)
            self._bufs[(name, dtype)] = buf
        return buf[:numel]

    def clear(self) -> None:
        self._bufs.clear()


_WORKSPACE = _Workspace()


def release_workspace() -> None:
    """Free the scratch buffers kept between tree_attention calls."""
    _WORKSPACE.clear()


def gather_paged_kv(key_cache: torch.Tensor, value_cache: torch.Tensor,
                    block_table_row: torch.Tensor, num_tokens: int, *, layout: str
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V ``[num_tokens, Hkv, D]`` (cache dtype) of logical positions ``0 .. num_tokens-1``.

    key_cache / value_cache: ``[num_blocks, Hkv, block_size, D]`` views as vLLM's CPU backend
    builds them; block_table_row: logical block -> physical block; layout: the layer's ISA.
    """
    _, hkv, bs, d = key_cache.shape
    check_layout(layout, key_cache.dtype, bs, d)
    k_half, v_half = half_layouts(layout)
    nblk = -(-num_tokens // bs)
    ids = block_table_row[:nblk].to(torch.int64).view(1, nblk)
    k = gather_blocks(key_cache, ids, k_half)[:, 0, :num_tokens].transpose(0, 1).contiguous()
    v = gather_blocks(value_cache, ids, v_half)[:, 0, :num_tokens].transpose(0, 1).contiguous()
    return k, v


def decode_anc_mask(anc_mask: torch.Tensor, num_cols: int) -> torch.Tensor:
    """bool [T, num_cols]: bit j of each row's int64 words (word j // 64, bit j % 64)."""
    words = anc_mask.to(torch.int64)
    bits = (words.unsqueeze(-1) >> _BITS) & 1          # arithmetic shift; & 1 keeps the bit
    return bits.flatten(1)[:, :num_cols].bool()


def _padded_kv(cache: torch.Tensor, ids: torch.Tensor, half: HalfLayout, cd: torch.dtype,
               name: str, stale: torch.Tensor) -> torch.Tensor:
    """[Hkv, B, L, D] in `cd` from workspace buffers, zero at `stale` (flat indices into B*L)."""
    hkv, bs, d = cache.shape[1], cache.shape[2], cache.shape[3]
    numel = hkv * ids.numel() * bs * d
    x = gather_blocks(cache, ids, half, _WORKSPACE.get(name, numel, cache.dtype))
    if cache.dtype != cd:
        x = _WORKSPACE.get(name + "_cd", numel, cd).view(x.shape).copy_(x)
    # Past a request's kv_len the blocks hold stale data or (via clamped table entries) other
    # requests' data; masked columns get probability 0, but 0 * NaN is NaN, so zero them.
    if stale.numel():
        x.view(hkv, -1, d).index_fill_(1, stale, 0)
    return x


@dataclass
class TreeMaskPlan:
    """What every layer of one verification step shares: the KV blocks to gather, the stale
    columns to zero, the query-row layout and the additive mask. Built once per step by
    `plan_tree_attention`, applied per layer by `apply_tree_attention` (the mask lives in the
    workspace; only the most recent plan may be applied, which `generation` checks)."""
    ids: torch.Tensor            # int64 [B, nblk] physical blocks
    stale: torch.Tensor          # flat indices into B * L to zero
    rows: torch.Tensor           # [B, n_max] flat query row of each padded row
    keep: torch.Tensor           # flat indices of the real rows among B * n_max
    mask: torch.Tensor           # [1, B, n_max * G, L] additive mask in the compute dtype
    shape: tuple[int, ...]       # (T, Hq, Hkv, D, num_blocks, block_size)
    n_max: int
    compute_dtype: torch.dtype
    generation: int


def plan_tree_attention(block_table: torch.Tensor, prefix_lens: torch.Tensor, offsets: torch.Tensor,
                        anc_mask: torch.Tensor, *, num_rows: int, num_q_heads: int, num_kv_heads: int,
                        head_size: int, num_blocks: int, block_size: int,
                        compute_dtype: torch.dtype = torch.float32,
                        tree_sizes: torch.Tensor | None = None) -> TreeMaskPlan:
    """The per-step part of `tree_attention` (arguments as there; shapes from the caches)."""
    t, hq, hkv, d, nb, bs = num_rows, num_q_heads, num_kv_heads, head_size, num_blocks, block_size
    if hq % hkv:
        raise ValueError(f"{hq} query heads do not fit {hkv} KV heads")
    cd = compute_dtype
    offsets = offsets.to(torch.int64)
    b = offsets.numel() - 1
    sizes = offsets[1:] - offsets[:-1]
    prefix = prefix_lens.to(torch.int64)
    t_sizes = sizes if tree_sizes is None else tree_sizes.to(torch.int64)
    kv_len = prefix + t_sizes
    n_max, l_max = int(sizes.max()), int(kv_len.max())
    t_max = int(t_sizes.max())
    nblk = -(-l_max // bs)
    if block_table.shape[1] < nblk:
        raise ValueError(f"block_table has {block_table.shape[1]} columns, need {nblk}")
    if anc_mask.shape[0] != t or anc_mask.shape[1] * 64 < t_max:
        raise ValueError(f"anc_mask {tuple(anc_mask.shape)} does not cover {t} rows of "
                         f"up to {t_max} nodes")
    ids = block_table[:, :nblk].to(torch.int64).clamp(0, nb - 1)
    width = nblk * bs
    pos = torch.arange(width)
    stale = (pos[None, :] >= kv_len[:, None]).flatten().nonzero().flatten()   # into B * L

    # Visibility [B, n_max, L]: every prefix column, plus tree column prefix + j when bit j of
    # the row is set. The tree bits are scattered into a mask t_max columns wider than L so
    # that padding nodes (j >= tree size) land past L instead of clobbering real columns.
    local = torch.arange(n_max)
    row_ok = local[None, :] < sizes[:, None]                          # [B, n_max]
    rows = (offsets[:-1, None] + local[None, :]).clamp(max=t - 1)       # padded -> flat row
    node = torch.arange(t_max)
    node_ok = node[None, :] < t_sizes[:, None]                          # [B, t_max]
    anc = decode_anc_mask(anc_mask, t_max)[rows] & row_ok[:, :, None] & node_ok[:, None, :]
    wide = (torch.arange(width + t_max)[None, :] < prefix[:, None])[:, None, :]
    wide = wide.expand(b, n_max, -1).contiguous()
    cols = torch.where(node_ok, prefix[:, None] + node[None, :], width + node[None, :])
    wide.scatter_(2, cols[:, None, :].expand(b, n_max, t_max), anc)
    wide[:, :, 0] |= ~row_ok         # padding rows see one column (no NaN); dropped below

    # GQA without repeating K/V: the G query heads of a KV head become extra query rows,
    # ordered (node, head in group), so each node's mask row is written G times in a row.
    g = hq // hkv
    mask = _WORKSPACE.get("mask", b * n_max * g * width, cd).view(b, n_max, g, width)
    torch.where(wide[:, :, None, :width].expand(b, n_max, g, width), torch.zeros((), dtype=cd),
                torch.full((), float("-inf"), dtype=cd), out=mask)
    _WORKSPACE.generation += 1
    return TreeMaskPlan(ids=ids, stale=stale, rows=rows, keep=row_ok.flatten().nonzero().flatten(),
                        mask=mask.view(1, b, n_max * g, width), shape=(t, hq, hkv, d, nb, bs),
                        n_max=n_max, compute_dtype=cd, generation=_WORKSPACE.generation)


def apply_tree_attention(plan: TreeMaskPlan, query: torch.Tensor, key_cache: torch.Tensor,
                         value_cache: torch.Tensor, scale: float, *, layout: str,
                         logits_soft_cap: float | None = None) -> torch.Tensor:
    """The per-layer part of `tree_attention`: gather this layer's K/V, one masked attention."""
    if plan.generation != _WORKSPACE.generation:
        raise RuntimeError("tree attention plan is stale: a newer plan reused its mask buffer")
    t, hq, d = query.shape
    nb, hkv, bs, dk = key_cache.shape
    if (t, hq, hkv, d, nb, bs) != plan.shape or dk != d:
        raise ValueError(f"query {tuple(query.shape)} / cache {tuple(key_cache.shape)} do not match "
                         f"the plan (T, Hq, Hkv, D, blocks, block_size) = {plan.shape}")
    check_layout(layout, key_cache.dtype, bs, dk)
    cd = plan.compute_dtype
    b, n_max, g = plan.rows.shape[0], plan.n_max, hq // hkv
    # K/V head-major [Hkv, B, L, D]; SDPA takes (Hkv, B) as its two batch axes.
    k_half, v_half = half_layouts(layout)
    k = _padded_kv(key_cache, plan.ids, k_half, cd, "k", plan.stale)
    v = _padded_kv(value_cache, plan.ids, v_half, cd, "v", plan.stale)
    q = _WORKSPACE.get("q", hkv * b * n_max * g * d, cd).view(hkv, b, n_max, g, d)
    torch.ops.aten.index.Tensor_out(query.to(cd).view(t, hkv, g, d).transpose(0, 1),
                                    [None, plan.rows], out=q)
    q = q.view(hkv, b, n_max * g, d)
    if logits_soft_cap:
        s = torch.matmul(q, k.transpose(-1, -2)).mul_(scale)
        s = torch.tanh(s.div_(logits_soft_cap)).mul_(logits_soft_cap)
        o = torch.matmul(torch.softmax(s.add_(plan.mask), dim=-1), v)
    else:
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=plan.mask, scale=scale)
    out = torch.empty(t, hkv, g, d, dtype=cd)
    torch.ops.aten.index.Tensor_out(o.view(hkv, b * n_max, g, d).transpose(0, 1), [plan.keep], out=out)
    return out.view(t, hq, d).to(query.dtype)


def tree_attention(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor,
                   block_table: torch.Tensor, prefix_lens: torch.Tensor, offsets: torch.Tensor,
                   anc_mask: torch.Tensor, scale: float, *, layout: str,
                   compute_dtype: torch.dtype | None = None,
                   logits_soft_cap: float | None = None,
                   tree_sizes: torch.Tensor | None = None) -> torch.Tensor:
    """Masked attention of every tree row over its prefix and its ancestors-or-self.

    query: ``[T, Hq, D]``, only the tree rows, request r at rows ``offsets[r] .. offsets[r+1]-1``
    (node order, root first; or any subset of its nodes when ``tree_sizes`` is given: rows are
    then identified by their anc_mask words alone, whose self bit names the node);
    tree_sizes: int [B] nodes of each request's tree whose K/V follow its prefix (default: its
    number of rows); key_cache / value_cache: ``[num_blocks, Hkv, block_size, D]``
    views (Hq a multiple of Hkv; query head h reads KV head ``h // (Hq // Hkv)``);
    block_table: ``[B, max_blocks]`` logical -> physical block; prefix_lens: int [B]
    (num_computed); offsets: int [B+1]; anc_mask: int64 ``[T, W]`` local ancestor-or-self
    bitmask words (TreeBatch format); layout: the layer's ISA (see cpu_kv_layout).
    compute_dtype defaults to float32 (float64 stays float64). logits_soft_cap follows vLLM
    (``cap * tanh(s / cap)`` before masking). Returns ``[T, Hq, D]`` in the query dtype.
    Not handled (callers fall back to plain decoding): sliding window, ALiBi, sinks, fp8 caches.
    """
    t, hq, d = query.shape
    nb, hkv, bs, dk = key_cache.shape
    check_layout(layout, key_cache.dtype, bs, dk)
    if dk != d or hq % hkv:
        raise ValueError(f"query [T, {hq}, {d}] does not fit a cache with {hkv} KV heads of {dk}")
    if t == 0:
        return query.new_empty(0, hq, d)
    cd = compute_dtype or (torch.float64 if query.dtype == torch.float64 else torch.float32)
    plan = plan_tree_attention(block_table, prefix_lens, offsets, anc_mask, num_rows=t,
                               num_q_heads=hq, num_kv_heads=hkv, head_size=d, num_blocks=nb,
                               block_size=bs, compute_dtype=cd, tree_sizes=tree_sizes)
    return apply_tree_attention(plan, query, key_cache, value_cache, scale, layout=layout,
                                logits_soft_cap=logits_soft_cap)
