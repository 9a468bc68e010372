"""Tree-aware Triton attention for CUDA, registered in place of vLLM's TRITON_ATTN (same name) by
deployments that draft branching trees (engine.activate_tree_attention).

As on CPU (engine/tree_attention_backend.py), vLLM's own kernel (`unified_attention`) runs for
the whole batch unchanged: it is exact for prefills, plain decodes, chain-shaped drafts and the
first chain of every tree. Then every request whose tree branches (the step's `AttentionPlan`,
engine/tree_step.py) is recomputed, all its nodes, by `kernels.tree_attention.
paged_tree_attention` over the same paged cache (prefix unmasked, tree part by ancestor words)
and written over those output rows. Whole trees, not only the wrong rows: the kernel's query
row i must be node i at KV position prefix + i.

Per-step plan: the kernel's index tensors (node rows, q_offsets, prefix lengths, block-table
rows, ancestor words) and its bounds (max_rows, max_prefix: no host sync) are built once per
step on the device, lazily on the first attention layer, from the step's plan, cached in
`AttentionPlan.kernel_plans` under the block table tensor and reused unchanged by every layer.
Per layer the host work is one gather of the tree rows' queries, the launch and one scatter;
the split count and the split scratch are made on the first layer too.

Backend choice: vLLM 0.32 picks FLASH_ATTN first on CUDA unless the operator chose one
(`--attention-backend` / `attention_config.backend`). A tree deployment selects TRITON_ATTN
itself when the operator chose nothing (`select_tree_backend`, called by TreeProposer's
constructor in each worker, before the model's attention layers pick their backend; vLLM's own
Gemma4 config sets the same field the same way). Chosen because the choice has one valid
answer: requiring a flag would only turn every first tree deployment into a startup error. An
explicit other backend is the operator's decision and is refused there, with a message naming
`--attention-backend TRITON_ATTN` or `tree.builder: chain`.

CUDA graphs: the row overwrite is Python in this forward, so it is not in a FULL CUDA graph
captured for some other batch. The `_determine_batch_execution_and_padding` runner patch
(engine/runner_patches.py) therefore dispatches steps with branching trees with FULL excluded:
they run PIECEWISE (attention runs eagerly between the graph pieces, this forward included) or
eagerly; chain-shaped and plain decode steps have no tree rows and keep their full graphs.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.triton_attn import TritonAttentionBackend, TritonAttentionImpl

from vllm_treespec.engine.tree_step import AttentionPlan, step_to_mask

__all__ = ["CLASS_PATH", "TritonTreePlan", "TreeTritonAttentionBackend",
           "TreeTritonAttentionImpl", "register", "triton_tree_plan"]

CLASS_PATH = "vllm_treespec.engine.tree_attention_triton.TreeTritonAttentionBackend"


@dataclass
class TritonTreePlan:
    """The kernel's inputs for the step's branching trees, on the device, shared by all layers."""
    rows: torch.Tensor          # int64 [Tn] flat token row of every node, request by request
    q_offsets: torch.Tensor     # int64 [Rb+1] first node row (in `rows`) of each request
    prefix_lens: torch.Tensor   # int64 [Rb] KV tokens before each root
    block_table: torch.Tensor   # int32 [Rb, max_blocks] the requests' rows of the step's table
    anc_mask: torch.Tensor      # int64 [Tn, W] ancestor-or-self words of every node
    max_rows: int               # largest tree (host: no sync)
    max_prefix: int             # longest prefix (host)
    num_splits: dict[tuple, int] = field(default_factory=dict)  # per layer geometry
    workspaces: dict[tuple, torch.Tensor | None] = field(default_factory=dict)  # split scratch


def triton_tree_plan(attn: AttentionPlan, block_table: torch.Tensor) -> TritonTreePlan:
    """The step's plan on the block table's device: one host-to-device copy, one gather."""
    key = ("triton", block_table.data_ptr(), tuple(block_table.shape))
    plan = attn.kernel_plans.get(key)
    if plan is not None:
        return plan
    sizes = attn.tree_sizes
    offsets = torch.zeros(sizes.numel() + 1, dtype=torch.int64)
    torch.cumsum(sizes, 0, out=offsets[1:])
    tn, r = attn.tree_rows.numel(), sizes.numel()
    anc = attn.tree_anc_mask
    host = torch.cat([attn.tree_rows, offsets, attn.prefix_lens, attn.req_indices, anc.reshape(-1)])
    dev = host.to(block_table.device)
    parts = torch.split(dev, [tn, r + 1, r, r, anc.numel()])
    plan = attn.kernel_plans[key] = TritonTreePlan(
        rows=parts[0], q_offsets=parts[1], prefix_lens=parts[2],
        block_table=block_table[parts[3]], anc_mask=parts[4].view(tn, anc.shape[1]),
        max_rows=int(sizes.max()), max_prefix=int(attn.prefix_lens.max()))
    return plan


def _splits(plan: TritonTreePlan, query: torch.Tensor,
            num_kv_heads: int) -> tuple[int, torch.Tensor | None]:
    """Prefix splits for this layer geometry (flash-decoding; 1 in the CPU interpreter) and
    their scratch, both made on the first layer and reused by every layer of the step."""
    geometry = (query.shape[1], num_kv_heads, query.shape[2], query.dtype, query.device)
    splits = plan.num_splits.get(geometry)
    if splits is None:
        from vllm_treespec.kernels.tree_attention import default_num_splits, split_workspace

        splits = plan.num_splits[geometry] = default_num_splits(
            query, num_kv_heads, int(plan.prefix_lens.numel()), plan.max_rows, plan.max_prefix)
        plan.workspaces[geometry] = split_workspace(splits, query.shape[0], query.shape[1],
                                                    query.shape[2], query.device)
    return splits, plan.workspaces[geometry]


class TreeTritonAttentionImpl(TritonAttentionImpl):
    tree_masks = True       # engine/model_checks.unsupported_reason accepts this impl

    def forward(self, layer: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                kv_cache: torch.Tensor, attn_metadata: Any, output: torch.Tensor,
                output_scale: torch.Tensor | None = None,
                output_block_scale: torch.Tensor | None = None) -> torch.Tensor:
        output = super().forward(layer, query, key, value, kv_cache, attn_metadata, output,
                                 output_scale, output_block_scale)
        step = step_to_mask(self.attn_type == AttentionType.DECODER, attn_metadata)
        if step is None:
            return output
        if getattr(attn_metadata, "rswa_window", None) is not None:
            raise RuntimeError("tree attention: R-SWA windows are not applied by the tree kernel "
                               "(engine/backend_choice.py refuses such models at startup)")
        if output_scale is not None:
            raise RuntimeError(
                "tree attention: this layer's output is quantized inside the attention op "
                "(fused output quantization), which the tree kernel does not do; serve without "
                "it or set tree.builder: chain")
        from vllm_treespec.kernels.tree_attention import paged_tree_attention

        start = time.perf_counter()
        plan = triton_tree_plan(step.attn, attn_metadata.block_table)
        key_cache, value_cache = kv_cache.transpose(1, 2).split(self.head_size, dim=-1)
        q = query.view(query.shape[0], self.num_heads, self.head_size)[plan.rows]
        splits, workspace = _splits(plan, q, self.num_kv_heads)
        out = paged_tree_attention(
            q, key_cache, value_cache, plan.block_table, plan.prefix_lens, plan.q_offsets,
            plan.anc_mask, self.scale, logits_soft_cap=self.logits_soft_cap or None,
            max_rows=plan.max_rows, max_prefix=plan.max_prefix,
            num_splits=splits, workspace=workspace)
        output.view(output.shape[0], self.num_heads, self.head_size).index_copy_(
            0, plan.rows, out.to(output.dtype))
        step.attn.seconds += time.perf_counter() - start     # launch time only on CUDA (async)
        return output


class TreeTritonAttentionBackend(TritonAttentionBackend):
    """TRITON_ATTN with tree rows masked by their ancestors (get_name() stays "TRITON_ATTN")."""

    @staticmethod
    def get_impl_cls() -> type[TreeTritonAttentionImpl]:
        return TreeTritonAttentionImpl


def register() -> None:
    """Make every TRITON_ATTN layer built from now on use this backend."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.TRITON_ATTN, CLASS_PATH)
