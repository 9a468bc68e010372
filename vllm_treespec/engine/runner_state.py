"""Reads of the V1 model runner's state that the proposer and the tree patches need (vLLM 0.32.0
attribute names).

Kept in one place so that a vLLM upgrade has one file to check besides the patch signatures:
the proposer, its step modules and the verify-cost profile read vLLM's runner only through these
functions. `runner` is a `GPUModelRunner` (CPUModelRunner inherits it); the proposer's stock
`custom_class` entry point and engine-free tests pass None or a runner without `requests`,
which the per-request reads answer with None.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch

__all__ = ["batch_req_ids", "batch_tokens", "live_req_ids", "device_kv", "discarded_rows", "dummy_forward", "finished_outputs",
           "kv_caches_and_layout", "layer_kv_caches", "num_computed_tokens", "request_limits",
           "request_params", "request_progress", "request_sampling", "request_temperature", "runner_device",
           "runner_drafter", "step_batch", "step_positions", "step_query_start", "step_slot_mapping", "total_scheduled_tokens"]


def runner_drafter(runner: Any) -> Any:
    """The runner's speculative proposer (`runner.drafter`; None without speculation)."""
    return getattr(runner, "drafter", None)


# -- the persistent batch (InputBatch): one row per running request ----------------------------
def batch_req_ids(runner: Any, num_reqs: int | None = None) -> list[str]:
    """Request ids in batch row order (the first `num_reqs` rows; all when None)."""
    ids = list(runner.input_batch.req_ids)
    return ids if num_reqs is None else ids[:num_reqs]


def batch_tokens(runner: Any) -> tuple[list[str], np.ndarray, np.ndarray]:
    """(request ids in row order, token buffer int32 [max_num_reqs, max_model_len], tokens per
    row without drafts int32 [max_num_reqs]): row i holds request i's prompt and output so far."""
    batch = runner.input_batch
    return list(batch.req_ids), batch.token_ids_cpu, batch.num_tokens_no_spec


def live_req_ids(runner: Any) -> list[str]:
    """The runner's own list of request ids in row order (not a copy: read it, do not keep it)."""
    return runner.input_batch.req_ids


def step_to_sample(runner: Any) -> Any | None:
    """The scheduler output of the step `execute_model` ran and `sample_tokens` is about to
    sample (vLLM's ephemeral `execute_model_state`); None when there is none (a pipeline or KV
    transfer pass-through)."""
    state = runner.execute_model_state
    return state.scheduler_output if state is not None else None


def num_computed_tokens(runner: Any) -> np.ndarray:
    """int32 [max_num_reqs]: tokens each batch row has in the KV cache before this step."""
    return runner.input_batch.num_computed_tokens_cpu


def finished_outputs(runner: Any, req_ids: Sequence[str]) -> list[np.ndarray]:
    """int32 [output tokens] of each request that still has a batch row (read before vLLM
    removes the rows); requests without one are skipped."""
    batch = runner.input_batch
    rows = [batch.req_id_to_index.get(r) for r in req_ids]
    return [batch.token_ids_cpu[i, batch.num_prompt_tokens[i]: batch.num_tokens_no_spec[i]]
            for i in rows if i is not None]


def step_query_start(runner: Any) -> np.ndarray:
    """int32 [num_reqs + 1]: this step's query_start_loc after `_prepare_inputs` (request i's
    scheduled tokens are flat rows query_start_loc[i] .. query_start_loc[i + 1] - 1)."""
    return runner.query_start_loc.np[:runner.input_batch.num_reqs + 1]


def step_batch(runner: Any) -> tuple[list[str], np.ndarray, np.ndarray]:
    """This step's batch after `_prepare_inputs`: (request ids in row order, query_start_loc
    int32 [num_reqs + 1], num_computed_tokens int32 [num_reqs])."""
    num_reqs = runner.input_batch.num_reqs
    return (batch_req_ids(runner, num_reqs), step_query_start(runner),
            runner.input_batch.num_computed_tokens_cpu[:num_reqs])


def step_positions(runner: Any) -> np.ndarray:
    """int64 [num_step_tokens]: the token position of every flat row of the step that just ran
    (tree rows: num_computed + depth, as the `_prepare_inputs` patch wrote them)."""
    return runner.positions.to("cpu").numpy()


def runner_device(runner: Any) -> torch.device | str:
    """The device the runner's tensors (and vLLM's request generators) live on."""
    return getattr(runner, "device", "cpu")


def total_scheduled_tokens(scheduler_output: Any) -> int:
    """Query tokens of the step the scheduler output scheduled (0 when it has none)."""
    return int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)


# -- per request (CachedRequestState) ------------------------------------------------------------
def _cached(runner: Any, req_id: str) -> Any:
    """vLLM's CachedRequestState of a request; None when the runner holds no such request."""
    return getattr(runner, "requests", {}).get(req_id)


def request_params(runner: Any, req_id: str) -> Any:
    """The request's SamplingParams (None: unknown request, or a pooling request)."""
    return getattr(_cached(runner, req_id), "sampling_params", None)


def request_temperature(runner: Any, req_id: str) -> float | None:
    """The request's sampling temperature (None: unknown request or no SamplingParams)."""
    return getattr(request_params(runner, req_id), "temperature", None)


def request_progress(runner: Any, req_id: str) -> tuple[Any, int] | None:
    """(SamplingParams or None, output tokens so far) of a request the runner holds, else None."""
    cached = _cached(runner, req_id)
    if cached is None:
        return None
    return cached.sampling_params, len(cached.output_token_ids)


def request_limits(runner: Any, req_id: str) -> tuple[int, int] | None:
    """(max_tokens, prompt tokens) of a request, None when either is unknown."""
    cached = _cached(runner, req_id)
    max_tokens = getattr(getattr(cached, "sampling_params", None), "max_tokens", None)
    num_prompt = getattr(cached, "num_prompt_tokens", None)
    if max_tokens is None or num_prompt is None:
        return None
    return int(max_tokens), int(num_prompt)


def discarded_rows(runner: Any, num_reqs: int) -> np.ndarray:
    """bool [num_reqs]: requests whose sampled token vLLM discards this step (partial prefills)."""
    mask = getattr(runner, "discard_request_mask", None)
    if mask is None:
        return np.zeros(num_reqs, dtype=bool)
    return np.asarray(mask.np[:num_reqs], dtype=bool)


def batch_wants_logprobs(runner: Any) -> bool:
    """Whether any request of the step's batch asked for logprobs, top ones or of given tokens
    (vLLM's sampler computes them: `SamplingMetadata.max_num_logprobs` / `logprob_token_ids`)."""
    metadata = runner.input_batch.sampling_metadata
    return metadata.max_num_logprobs is not None or bool(metadata.logprob_token_ids)


def batch_has_seeded_sampling(runner: Any) -> bool:
    """Whether any request in the persistent batch samples with its own seed: vLLM keeps a
    generator per such row (`InputBatch.generators`) and none for the others."""
    return bool(runner.input_batch.generators)


def request_sampling(runner: Any, req_ids: Sequence[str]) -> list[Any]:
    """SamplingParams of each request. Its generator (`CachedRequestState.generator`) is not
    read: it is vLLM's sampler's, which may advance it in the same step; tree acceptance keeps
    its own (engine/tree_verifier.acceptance_generators)."""
    return [runner.requests[r].sampling_params for r in req_ids]


def take_drafts(runner: Any) -> Any:
    """This step's drafts (vLLM's DraftTokenIds, None without any), taken as vLLM's executor
    takes them over RPC: `take_draft_token_ids()` also clears them on the runner."""
    return runner.take_draft_token_ids()


def dummy_forward(runner: Any, num_tokens: int) -> None:
    """One forward of `num_tokens` dummy query tokens with attention (vLLM's profiling run)."""
    runner._dummy_run(num_tokens, force_attention=True)


def step_slot_mapping(runner: Any, rows: torch.Tensor) -> torch.Tensor:
    """KV slot of each given flat token row of this step (single KV cache group): on CUDA it
    stays on the device (compaction runs there: engine/device_verify.py), else on the host."""
    from vllm_treespec.engine import device_verify

    slots = runner.input_batch.block_table[0].slot_mapping.gpu
    picked = slots[rows.to(slots.device)]
    if device_verify.wanted(slots):
        return picked.to(torch.int64)
    return picked.to("cpu", torch.int64)


def _bound_caches(runner: Any) -> list[tuple[torch.Tensor, Any]]:
    """(KV cache view, its attention layer) of every layer, each cache once."""
    out: list[tuple[torch.Tensor, Any]] = []
    seen: set[int] = set()
    for ctx in runner.compilation_config.static_forward_context.values():
        kv = getattr(ctx, "kv_cache", None)
        if not isinstance(kv, torch.Tensor) or kv.numel() == 0 or kv.data_ptr() in seen:
            continue
        seen.add(kv.data_ptr())
        out.append((kv, ctx))
    return out


def layer_kv_caches(runner: Any) -> list[torch.Tensor]:
    """Every attention layer's bound KV cache view (each once), as the attention ops see it."""
    return [kv for kv, _ in _bound_caches(runner)]


def device_kv(runner: Any, cached: Any = None) -> Any:
    """The runner's caches as device pointer tables (engine/device_verify.DeviceKV): `cached`
    while the runner still holds the caches it was built from (`runner.kv_caches`, the list
    vLLM binds once), else built anew from every layer's view."""
    from vllm_treespec.engine.device_verify import DeviceKV, cache_token

    token = cache_token(getattr(runner, "kv_caches", None) or [])
    if cached is not None and cached.token == token:
        return cached
    return DeviceKV.from_caches(layer_kv_caches(runner), token)


def kv_caches_and_layout(runner: Any) -> tuple[list[torch.Tensor], str]:
    """Every attention layer's KV cache tensor (each once) and their common CPU layout (ISA)."""
    bound = _bound_caches(runner)
    layouts = {getattr(ctx, "isa", "token_major") for _, ctx in bound}
    if len(layouts) != 1:
        raise RuntimeError(f"KV compaction needs one KV cache layout across layers, found {sorted(layouts)}")
    return [kv for kv, _ in bound], layouts.pop()
