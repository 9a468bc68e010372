"""Tree acceptance and KV compaction in place of vLLM's linear rejection sampler.

Called by the `_sample` patch for steps with a `TreeStep`. Two modes:
- own: every request in the batch is one trees serve exactly (engine/eligibility.py) and all
  drafts are ours, so one `verify.accept` call over the whole batch samples every request
  (requests without drafts are root-only trees) and vLLM's sampler does not run at all;
- mixed: some request needs vLLM's sampler (logprobs, penalties, ...; those have no drafts),
  so vLLM's sampler runs as usual and the rows of the requests with tree drafts are then
  replaced by `accept` over their trees.
Output is vLLM's layout: int64 [num_reqs, max_num_draft + 1], accepted tokens then the bonus
token, padded with -1, so the scheduler's rollback and `parse_output` work unchanged.

Then the accepted path's K/V are moved to the slots a chain would have used (verify/
kv_compaction.py explains why moving is all that is needed), in every layer, before the next
step runs. Requests whose path is the node prefix 1..a move nothing.

Sampling: greedy requests (temperature < 1e-5) take the argmax; others use the
``target_only`` rule, which emits exact samples of the target distribution for trees whose
shape does not depend on this step's random numbers (all our drafters' trees are deterministic),
with each request's own seeded generator when it has one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np
import torch

from vllm_treespec.engine.tree_step import TreeStep
from vllm_treespec.verify import SamplingParamsBatch, accept
from vllm_treespec.verify.kv_compaction import compact_kv

__all__ = ["VerifyResult", "verify_step", "accepted_moves"]

SAMPLING_EPS = 1e-5  # vLLM's greedy threshold on temperature


@dataclass
class VerifyResult:
    sampled_token_ids: torch.Tensor     # int64 [num_reqs, W]
    accepted_len: np.ndarray            # int64 [R] accepted draft nodes per tree request
    num_nodes: np.ndarray               # int64 [R] draft nodes verified per tree request
    num_moves: int                      # KV slots moved


def sampling_batch(params: Sequence[Any]) -> SamplingParamsBatch:
    """Temperature / top-k / top-p / min-p of vLLM SamplingParams, one per request."""
    return SamplingParamsBatch.from_lists(
        temperature=[float(p.temperature) for p in params],
        top_k=[int(p.top_k or 0) for p in params],
        top_p=[float(p.top_p) for p in params],
        min_p=[float(p.min_p) for p in params])


def _layout(step: TreeStep, own: bool) -> tuple[torch.Tensor, ...]:
    """(offsets, tokens, parents, depth, logit_rows, batch_rows) of the requests accept() sees."""
    t = step.trees
    if not own:
        return (t.offsets, t.tokens, t.parents, t.depth, step.logit_rows,
                torch.from_numpy(step.req_indices))
    # every batch request: root-only for those without drafts, in logits order
    sizes = torch.ones(step.num_reqs, dtype=torch.int64)
    idx = torch.from_numpy(step.req_indices)
    sizes[idx] = t.offsets[1:] - t.offsets[:-1]
    offsets = torch.zeros(step.num_reqs + 1, dtype=torch.int64)
    torch.cumsum(sizes, 0, out=offsets[1:])
    total = int(offsets[-1])
    tokens = torch.zeros(total, dtype=torch.int64)
    parents = torch.full((total,), -1, dtype=torch.int64)
    depth = torch.zeros(total, dtype=torch.int64)
    tokens[step.logit_rows] = t.tokens
    parents[step.logit_rows] = t.parents
    depth[step.logit_rows] = t.depth
    return offsets, tokens, parents, depth, torch.arange(total), torch.arange(step.num_reqs)


def verify_step(step: TreeStep, logits: torch.Tensor, params: Sequence[Any],
                generators: Sequence[torch.Generator | None], own: bool,
                base: torch.Tensor | None) -> tuple[torch.Tensor, Any]:
    """Sampled token ids [num_reqs, W] and accept()'s result (rows of the tree requests).

    params / generators: per batch request (own) or per tree request (mixed); base: vLLM's
    sampler output to overwrite (mixed) or None (own).
    """
    offsets, tokens, parents, depth, logit_rows, batch_rows = _layout(step, own)
    width = step.max_num_draft + 1
    sampling = sampling_batch(params)
    greedy = bool((sampling.temperature < SAMPLING_EPS).all())
    result = accept((offsets, tokens, parents, depth), logits[logit_rows],
                    mode="greedy" if greedy else "target_only",
                    sampling=None if greedy else sampling,
                    generators=None if greedy else list(generators), max_depth=width - 1)
    if base is None:
        out = result.emitted
    else:
        if base.shape != (step.num_reqs, width):
            raise RuntimeError(f"vLLM's sampler returned {tuple(base.shape)}, expected "
                               f"({step.num_reqs}, {width})")
        out = base.clone()
        out[batch_rows] = result.emitted.to(out.dtype)
    return out, result


def accepted_moves(step: TreeStep, accepted_nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(src_slots, dst_slots) moving each tree request's accepted node i_j to slot of node j.

    accepted_nodes: int64 [R, W] local node indices of each tree request's path (-1 padded).
    """
    nodes = accepted_nodes
    j = torch.arange(1, nodes.shape[1] + 1).expand_as(nodes)
    keep = (nodes >= 0) & (nodes != j)
    if not bool(keep.any()):
        empty = torch.zeros(0, dtype=torch.int64)
        return empty, empty
    start = step.trees.offsets[:-1, None].expand_as(nodes)
    assert step.slot_mapping is not None
    src = step.slot_mapping[(start + nodes)[keep]]
    dst = step.slot_mapping[(start + j)[keep]]
    return src, dst


def compact(step: TreeStep, accepted_nodes: torch.Tensor, kv_caches: Sequence[torch.Tensor],
            layout: str) -> int:
    """Move accepted K/V into chain order in every layer; returns the number of slots moved."""
    src, dst = accepted_moves(step, accepted_nodes)
    if src.numel():
        compact_kv(kv_caches, src, dst, layout=layout)
    return int(src.numel())
