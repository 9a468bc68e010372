"""Tree-aware CPU attention backend, registered in place of vLLM's CPU_ATTN (same name) by deployments
that draft branching trees (engine.activate_tree_attention).

vLLM 0.32.0 has no attention backend that takes a custom mask. This backend runs the stock CPU
kernel for the whole batch (exact for prompts, plain decodes, chain-shaped drafts and the first
chain of every tree) and then recomputes the other tree rows with the ancestor mask over the paged KV cache
(`vllm_treespec.attention.tree_attention`), overwriting those rows of the output. Which rows,
and their masks, come from the step's `TreeStep` (engine/tree_step.py), published by the
`_prepare_inputs` patch; outside a tree step the backend is the stock one.

CUDA hosts: engine/tree_attention_triton.py does the same over vLLM's TRITON_ATTN backend with
the Triton paged tree kernel.
"""
from __future__ import annotations

import time
from typing import Any

import torch

from vllm.v1.attention.backend import AttentionType
from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend, CPUAttentionBackendImpl

from vllm_treespec.attention.tree_attention_cpu import apply_tree_attention, plan_tree_attention
from vllm_treespec.engine.model_checks import unsupported_reason  # noqa: F401  (moved there)
from vllm_treespec.engine.tree_step import step_to_mask

CLASS_PATH = "vllm_treespec.engine.tree_attention_backend.TreeCPUAttentionBackend"


class TreeCPUAttentionImpl(CPUAttentionBackendImpl):
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
        plan = step.attn
        start = time.perf_counter()
        nb, hkv, bs, _ = kv_cache.shape
        key_cache, value_cache = kv_cache.view(nb, hkv, 2 * bs, -1).chunk(2, dim=2)
        rows = plan.rows
        # The mask, blocks and row layout are the same in every layer of the step: plan once.
        geometry = (nb, hkv, bs, self.num_heads, self.head_size)
        masks = plan.kernel_plans.get(geometry)
        if masks is None:
            masks = plan.kernel_plans[geometry] = plan_tree_attention(
                attn_metadata.block_table[plan.req_indices], plan.prefix_lens, plan.offsets,
                plan.anc_mask, num_rows=int(rows.numel()), num_q_heads=self.num_heads,
                num_kv_heads=hkv, head_size=self.head_size, num_blocks=nb, block_size=bs,
                tree_sizes=plan.tree_sizes)
        out = apply_tree_attention(
            masks, query.view(query.shape[0], self.num_heads, self.head_size)[rows], key_cache,
            value_cache, self.scale, layout=layer.isa, logits_soft_cap=self.logits_soft_cap or None)
        output.view(output.shape[0], self.num_heads, -1)[rows] = out.to(output.dtype)
        plan.seconds += time.perf_counter() - start
        return output


class TreeCPUAttentionBackend(CPUAttentionBackend):
    """CPU_ATTN with tree rows masked by their ancestors (get_name() stays "CPU_ATTN")."""

    @staticmethod
    def get_impl_cls() -> type[TreeCPUAttentionImpl]:
        return TreeCPUAttentionImpl


def register() -> None:
    """Make every CPU attention layer built from now on use this backend."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    register_backend(AttentionBackendEnum.CPU_ATTN, CLASS_PATH)
