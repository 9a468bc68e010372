"""Sampling a tree step (instead of vLLM's rejection sampler): tree acceptance for every request
trees can serve exactly (root-only trees for those without drafts), vLLM's sampler for the rest,
then KV compaction of the accepted paths (engine/tree_verifier.py, engine/device_verify.py).

Tree acceptance draws a seeded request's coins from its own generator (`RequestState.generator`,
seeded like vLLM's), never from vLLM's, which vLLM's sampler advances in mixed steps: so a seeded
request samples the same tokens whatever shares its steps.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from vllm_treespec.engine import device_verify
from vllm_treespec.engine.request_table import RequestTable
from vllm_treespec.engine.runner_state import (batch_req_ids, device_kv, discarded_rows, kv_caches_and_layout,
                                               request_sampling, runner_device)
from vllm_treespec.engine.tree_step import TreeStep
from vllm_treespec.engine.tree_verifier import (GREEDY, acceptance_generators, compact, compact_device,
                                                count_moves, verify_step)

__all__ = ["TreeStepSampler", "VerifiedStep"]


@dataclass
class VerifiedStep:
    """What tree acceptance and compaction did in one step."""
    accepted_nodes: np.ndarray   # int64 [num_trees, W]: each tree's accepted node ids (-1 pad)
    accepted_len: list[int]      # accepted draft nodes per tree
    own: bool                    # tree acceptance sampled every request (vLLM's sampler did not run)
    moved: int                   # K/V rows compaction moved
    accept_seconds: float        # from the start of sampling to acceptance's result
    compact_seconds: float


class TreeStepSampler:
    """Samples tree steps; holds the runner's KV caches as device pointer tables (CUDA, built once)."""

    def __init__(self, coin_rows: int) -> None:
        self.coin_rows = coin_rows     # random draws per request (num_speculative_tokens + 1)
        self._device_kv: Any = None

    def sample(self, runner: Any, step: TreeStep, logits: Any, vllm_sample: Callable[[], Any],
               requests: RequestTable) -> tuple[Any, VerifiedStep | None]:
        """vLLM's SamplerOutput for the step, and what trees verified (None: vLLM sampled it all)."""
        from vllm.v1.outputs import SamplerOutput

        start = time.perf_counter()
        ids_all = batch_req_ids(runner, step.num_reqs)
        if step.num_trees == step.num_reqs and not step.has_foreign_drafts:
            include = None                     # every request drafted: all are verified as trees
        else:
            ours = np.fromiter((requests.blocker(r, runner) is None for r in ids_all), dtype=bool,
                               count=step.num_reqs)
            ours[step.req_indices] = True      # drafted trees are always verified as trees
            ours[step.foreign] = False         # vLLM's own padding drafts stay with vLLM
            include = None if ours.all() else np.nonzero(ours)[0]
        own = include is None
        base, logprobs = None, None
        if not own:
            out = vllm_sample()
            base, logprobs = out.sampled_token_ids, out.logprobs_tensors
            if include.size == 0:
                return out, None
        rows = range(step.num_reqs) if own else include.tolist()
        ids = [ids_all[i] for i in rows]
        params = request_sampling(runner, ids)
        # partial prefills: their token is discarded; sample it greedily so no seeded stream moves
        discarded = discarded_rows(runner, step.num_reqs)
        if discarded.any():
            for j in np.nonzero(discarded[np.asarray(rows, dtype=np.int64)])[0].tolist():
                params[j] = GREEDY
        gens = acceptance_generators(requests.generators, ids, params, runner_device(runner))
        tokens, result = verify_step(step, logits, params, gens, include, base, coin_rows=self.coin_rows)
        accepted_at = time.perf_counter()
        tree_rows = None                        # rows of the step's trees in the result
        if include is not None or step.num_trees != step.num_reqs:
            tree_rows = step.req_indices if include is None else np.searchsorted(include, step.req_indices)
        accepted_nodes, moved = self._compact(runner, step, logits, result.accepted_nodes, tree_rows)
        verified = VerifiedStep(accepted_nodes, (accepted_nodes >= 0).sum(axis=1).tolist(), own, moved,
                                accepted_at - start, time.perf_counter() - accepted_at)
        return SamplerOutput(sampled_token_ids=tokens, logprobs_tensors=logprobs), verified

    def _compact(self, runner: Any, step: TreeStep, logits: Any, accepted: torch.Tensor,
                 tree_rows: np.ndarray | None) -> tuple[np.ndarray, int]:
        """Move each accepted path's K/V to contiguous slots: (accepted nodes per tree on the
        host, rows moved). Chain-shaped steps cannot move K/V (TreeStep.chain_shaped)."""
        on_device = device_verify.wanted(logits)   # CUDA: logits, caches and slots live there
        if on_device and not step.chain_shaped and step.num_trees:
            # CUDA: compaction is queued on the device before anything is read back
            nodes = accepted.to(logits.device)
            if tree_rows is not None:
                nodes = nodes[torch.from_numpy(tree_rows).to(nodes.device)]
            self._device_kv = device_kv(runner, self._device_kv)
            compact_device(step, nodes, self._device_kv)
        # numpy from here: a few tiny arrays per step, where torch's per-op cost dominated
        accepted_nodes = accepted.cpu().numpy()
        if tree_rows is not None:
            accepted_nodes = accepted_nodes[tree_rows]
        if on_device:
            return accepted_nodes, count_moves(step, accepted_nodes) if not step.chain_shaped else 0
        if not step.chain_shaped and (accepted_nodes >= 0).any():
            caches, layout = kv_caches_and_layout(runner)
            return accepted_nodes, compact(step, accepted_nodes, caches, layout)
        return accepted_nodes, 0
