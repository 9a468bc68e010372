"""Tree acceptance and KV compaction in place of vLLM's linear rejection sampler.

Called by the `_sample` patch every step. Two modes:
- own: every request in the batch is one trees serve exactly (engine/eligibility.py) and all
  drafts are ours, so one acceptance call over the whole batch samples every request
  (requests without drafts are root-only trees) and vLLM's sampler does not run at all;
- mixed: some request needs vLLM's sampler (logprobs, penalties, ...; those have no drafts),
  so vLLM's sampler runs as usual and the rows of every other request (with or without
  drafts) are then replaced by acceptance over their trees.
Output is vLLM's layout: int64 [num_reqs, max_num_draft + 1], accepted tokens then the bonus
token, padded with -1, so the scheduler's rollback and `parse_output` work unchanged.

One pass down: this module hands the step's tree batch (with root-only trees for requests
verified without drafts, `_verified_batch`) to verify, which decides the accepted
paths and tokens in one call (`verify.accept_trees`), then the accepted path's K/V are moved to
the slots a chain would have used (verify/kv_compaction.py explains why moving is all that is
needed; verify/slot_moves.py says which node goes where), in every layer, before the next step
runs. Requests whose path is the node prefix 1..a move nothing. On CUDA the greedy walk
(verify/greedy.py) and the compaction (engine/device_verify.py) run on the device with the
Triton kernels.

Sampling: greedy requests (temperature < 1e-5) take the greedy walk; others use the
``target_only`` rule, which emits exact samples of the target distribution for trees whose
shape does not depend on this step's random numbers (top-k trees). Nodes whose children were
drawn from a drafter's q (the step carries their q rows, `TreeStep.q_rows`) are verified by
recursive rejection sampling without replacement instead, node by node in the same acceptance
call (verify/accept.py, compact ``draft_rows``).

Seeded requests: a seeded request's tokens depend on its own prompt, seed and trees only, never
on its batch. Two things make it so. (1) Acceptance draws the same coin block per request in
every mode (verify/coins.py), so a neighbour with sampled drafts (the batch then runs in "rrs"
mode) or a greedy neighbour changes nothing. (2) Acceptance draws from the plugin's own
generator per seeded request (`acceptance_generators`), seeded as vLLM seeds its own, never
from vLLM's (`CachedRequestState.generator`): in a mixed step vLLM's sampler first samples the
whole batch, ours included, and advances vLLM's generators, which would shift the coins of any
request that happened to share a step with, say, a logprobs request. vLLM's generator stays
vLLM's: it samples the steps in which vLLM serves the request (e.g. while min_tokens is pending).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch

from vllm_treespec.engine.tree_step import TreeStep
from vllm_treespec.tree.batch import TreeBatch
from vllm_treespec.verify import SAMPLING_EPS, accept_trees
from vllm_treespec.verify.kv_compaction import compact_kv
from vllm_treespec.verify.slot_moves import count_moves as count_node_moves
from vllm_treespec.verify.slot_moves import listed_moves, slot_moves

__all__ = ["acceptance_generators", "verify_step", "accepted_moves", "compact", "compact_device",
           "count_moves"]


@dataclass(frozen=True)
class _Greedy:
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0


GREEDY = _Greedy()   # sampling parameters of a row sampled greedily whatever the request asked


def acceptance_generators(table: dict[str, torch.Generator], req_ids: Sequence[str],
                          params: Sequence[Any], device: torch.device | str = "cpu"
                          ) -> list[torch.Generator | None]:
    """Tree acceptance's generator for each request: the plugin's own for a seeded sampled
    request, None (torch's default stream, like vLLM for unseeded requests) otherwise.

    table (req id -> generator) is the proposer's: a generator is created on the request's first
    use, seeded exactly as vLLM 0.32's model runner seeds its own for a RANDOM_SEED request
    (`torch.Generator(device=runner.device).manual_seed(seed)`, gpu_model_runner
    `_update_states`), and freed when the request finishes. Being separate from vLLM's, it moves
    only when tree acceptance samples this request, so its state (and the request's tokens)
    never depends on whether vLLM's sampler also ran in the step (module docstring)."""
    gens: list[torch.Generator | None] = []
    for req_id, p in zip(req_ids, params):
        seed = getattr(p, "seed", None)
        if seed is None or float(p.temperature) < SAMPLING_EPS:
            gens.append(None)          # greedy (no coins) or unseeded (no reproducibility asked)
            continue
        g = table.get(req_id)
        if g is None:
            g = table[req_id] = torch.Generator(device=device)
            g.manual_seed(int(seed))
        gens.append(g)
    return gens


def _verified_batch(step: TreeStep, include: np.ndarray | None
                    ) -> tuple[TreeBatch, torch.Tensor | None, np.ndarray | None]:
    """(trees, logit_rows, q_rows) of the batch requests accept_trees verifies: the step's tree
    batch itself when every request drafted (the usual decode step), else its trees with
    root-only trees for requests without drafts (`TreeBatch.gather`). include: sorted batch
    rows; None = every request (then logit_rows is None: all logits rows, in order)."""
    if include is None and step.num_trees == step.num_reqs:
        return step.trees, None, step.q_rows     # plan_tree_step lists them in batch order
    idx = np.arange(step.num_reqs) if include is None else include
    batch, src = step.trees.gather(step.tree_of_req[idx])
    q_rows = None
    if step.q_rows is not None:
        q_rows = np.where(src >= 0, step.q_rows[np.maximum(src, 0)], -1)
    logit_rows = None
    if include is not None:
        logit_rows = torch.from_numpy(np.repeat(step.first_logit[idx], batch.sizes.numpy())
                                      + batch.local.numpy())
    return batch, logit_rows, q_rows


def verify_step(step: TreeStep, logits: torch.Tensor, params: Sequence[Any],
                generators: Sequence[torch.Generator | None], include: np.ndarray | None,
                base: torch.Tensor | None, coin_rows: int | None = None) -> tuple[torch.Tensor, Any]:
    """Sampled token ids [num_reqs, W] and the acceptance result (one row per verified request).

    include: sorted batch rows verified here (None = all; then base is None); params /
    generators: one per verified request (the engine passes `acceptance_generators`, not vLLM's);
    base: vLLM's sampler output whose other rows are kept; coin_rows: fixed coin block per seeded
    request (see verify/coins.py). The mode ("rrs" as soon as one node has a q row) does not
    change any request's coins or the tokens of nodes without q rows (verify/coins.py).
    """
    batch, logit_rows, q_rows = _verified_batch(step, include)
    num_rows = logits.shape[0] if logit_rows is None else len(logit_rows)
    if num_rows != batch.num_rows:
        raise RuntimeError(f"tree verification: {num_rows} logits rows for "
                           f"{batch.num_rows} tree nodes; the step plan does not match vLLM's batch")
    width = step.max_num_draft + 1
    result = accept_trees(batch, logits, params, generators, width, logit_rows=logit_rows,
                          q_probs=step.q_probs, q_rows=q_rows, coin_rows=coin_rows)
    if base is None:
        return result.emitted, result
    if base.shape != (step.num_reqs, width):
        raise RuntimeError(f"vLLM's sampler returned {tuple(base.shape)}, expected "
                           f"({step.num_reqs}, {width})")
    out = base.clone()
    out[torch.from_numpy(include)] = result.emitted.to(out.dtype)
    return out, result


def accepted_moves(step: TreeStep, accepted_nodes: torch.Tensor | np.ndarray
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """(src_slots, dst_slots) int64 [M], the host path's moves: each tree request's accepted
    node i_j to the slot of node j (verify.slot_moves), request order, j ascending.

    accepted_nodes: int64 [R, W] local node indices of each tree request's path (-1 padded).
    """
    if step.slot_mapping is None:
        if count_node_moves(accepted_nodes):
            raise RuntimeError("KV compaction: an accepted path leaves its tree's first chain, "
                               "but the step has no slot mapping (its plan was chain-shaped)")
        empty = torch.zeros(0, dtype=torch.int64)
        return empty, empty
    return listed_moves(*slot_moves(step.slot_mapping, step.trees.offsets, accepted_nodes))


def count_moves(step: TreeStep, accepted_nodes: np.ndarray) -> int:
    """Moves a compaction of the step's accepted paths makes (verify.slot_moves' rule; the
    device path moves the same slots without reading them back)."""
    return count_node_moves(accepted_nodes)


def compact_device(step: TreeStep, accepted_nodes: torch.Tensor, kv: Any) -> None:
    """`compact` on the device: accepted_nodes int [R, W] of the step's trees, on the device;
    kv: the runner's device_verify.DeviceKV. Queued, not waited for."""
    from vllm_treespec.engine.device_verify import compact_on_device

    if step.slot_mapping is None:
        raise RuntimeError("KV compaction: the step has no slot mapping (its plan was "
                           "chain-shaped), so no accepted path can leave its first chain")
    compact_on_device(kv, step.slot_mapping, step.trees.to(accepted_nodes.device).offsets, accepted_nodes)


def compact(step: TreeStep, accepted_nodes: torch.Tensor | np.ndarray, kv_caches: Sequence[torch.Tensor],
            layout: str) -> int:
    """Move accepted K/V into chain order in every layer; returns the number of slots moved."""
    src, dst = accepted_moves(step, accepted_nodes)
    if src.numel():
        compact_kv(kv_caches, src, dst, layout=layout)
    return int(src.numel())
