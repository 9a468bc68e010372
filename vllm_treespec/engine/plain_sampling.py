"""Sampling a free idle step (no request carried drafts; the `_prepare_inputs` patch let vLLM
prepare it as a plain step): vLLM's plain sampler output, with the tokens of seeded sampled
requests re-drawn by tree acceptance from their own generators (root-only trees). Such a request
draws from the same stream whether or not other requests in its steps drafted, so its tokens do
not depend on other traffic. Others keep vLLM's token; when every row is re-drawn and nobody asked
for logprobs, vLLM's sampler is not run at all.
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np
import torch

from vllm_treespec.engine.request_table import RequestTable
from vllm_treespec.engine.runner_state import (batch_req_ids, batch_wants_logprobs,
                                               discarded_rows, request_sampling, runner_device)
from vllm_treespec.engine.tree_verifier import SAMPLING_EPS, acceptance_generators
from vllm_treespec.tree.batch import TreeBatch
from vllm_treespec.verify import accept_trees

__all__ = ["sample_plain_step"]


def sample_plain_step(runner: Any, logits: Any, vllm_sample: Callable[[], Any], query_start_loc: np.ndarray,
                      requests: RequestTable, coin_rows: int) -> Any:
    """vLLM's SamplerOutput for the plain step whose query_start_loc [num_reqs + 1] is given,
    seeded sampled requests (that trees may serve) re-drawn from their own streams. The `_sample`
    patch calls it only for a batch with seeded sampling (engine/runner_patches.py: without
    any there is nothing to re-draw, and the patch runs vLLM's sampler directly)."""
    from vllm.v1.outputs import SamplerOutput

    num_reqs = int(query_start_loc.size - 1)
    ids_all = batch_req_ids(runner, num_reqs)
    params = request_sampling(runner, ids_all)
    discarded = discarded_rows(runner, num_reqs)
    rows = [i for i, p in enumerate(params)
            if p.seed is not None and float(p.temperature) >= SAMPLING_EPS and not discarded[i]
            and requests.blocker(ids_all[i], runner) is None]
    if not rows:
        return vllm_sample()
    include = torch.from_numpy(np.asarray(rows, dtype=np.int64))
    # every row re-drawn and no logprobs asked: vLLM's sampler would only make tokens that are
    # replaced (it keeps no state between steps; its generators are not the re-draw's)
    replaced = len(rows) == num_reqs and not batch_wants_logprobs(runner)
    own_logits = logits[include] if replaced else logits[include].clone()  # vLLM edits in place
    out = None if replaced else vllm_sample()
    ids = [ids_all[i] for i in rows]
    sub = [params[i] for i in rows]
    gens = acceptance_generators(requests.generators, ids, sub, runner_device(runner))
    # root-only trees straight into the acceptance entry a tree step's verification uses (same
    # rule, same coin block per request): no step plan, no attention plan, no re-layout
    n = len(rows)
    roots = TreeBatch.root_only(torch.zeros(n, dtype=torch.int64))
    result = accept_trees(roots, own_logits, sub, gens, 1, coin_rows=coin_rows)
    if out is None:
        return SamplerOutput(sampled_token_ids=result.emitted.to(device=logits.device,
                                                                 dtype=torch.int32),
                             logprobs_tensors=None)
    sampled = out.sampled_token_ids.clone()
    sampled[include] = result.emitted.to(device=sampled.device, dtype=sampled.dtype)
    return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=out.logprobs_tensors)
