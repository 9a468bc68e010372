"""Patches on vLLM 0.32.0's V1 model runner (CPUModelRunner inherits them from GPUModelRunner)
and workers.

Why each exists:
- `propose_draft_token_ids`: vLLM's `custom_class` call passes neither request ids nor the
  scheduled budget nor hidden states; a TreeProposer gets the runner's full step context instead.
- `_update_states`: the only place a worker learns that requests finished or were aborted; the
  proposer frees their per-request state there.
- `_prepare_inputs`: a step in which no request carries drafts is prepared as a plain step
  (vLLM 0.32.0 builds spec-decode metadata and runs its speculative sampling path on every step
  once speculation is configured: about 0.9 ms of a 2 ms CPU step with nothing drafted); only
  seeded sampled requests are re-drawn from their own streams (`TreeProposer.sample_plain`).
  Otherwise, after vLLM computed positions and slots, match the scheduled drafts to our
  trees, rewrite tree rows' positions to num_computed + depth (slots stay contiguous) and
  publish the step's tree plan for the attention backend (engine/tree_step.py). Steps whose
  nodes all lie on their tree's first chain keep vLLM's positions (they are equal) and skip the
  slot gather (compaction cannot move anything there). The plan travels on the proposer
  (`TreeProposer.plan`) to the patches below, and through engine/tree_step.py's process global
  to the attention backends (`_publish_plan` says why).
- `_preprocess`: a free idle step skips vLLM's clamp of draft placeholders (-1) in the input
  ids, which it runs whenever speculation is configured; such a step has none.
- `_determine_batch_execution_and_padding`: a step with branching trees (its plan has tree
  rows to recompute) dispatches with CUDA graph mode FULL excluded: the attention backend
  overwrites those rows in Python (engine/tree_attention_triton.py), which a FULL graph
  captured for another batch would not contain. Such steps run PIECEWISE (attention eager
  between the pieces) or eagerly; chain-shaped and plain decode steps keep their full graphs.
  Runs after `_prepare_inputs`, which published the step's plan.
- `_input_fits_in_drafter`: vLLM drafts for the whole batch or for none of it: once any request
  is within num_speculative_tokens of max_model_len it gives every request num_speculative_tokens
  zero tokens as drafts, which the scheduler then schedules and the step verifies (a K=127
  deployment verified 80 rows of zeros per step near the end of a request; for vLLM's own
  methods too). A TreeProposer caps each request's nodes at its own room before max_model_len
  (engine/budget_control.py), so for it the check only asks whether the step has the metadata
  drafting needs.
- `_sample`: tree acceptance and KV compaction instead of the linear rejection sampler
  (engine/tree_verifier.py); the plan is withdrawn afterwards.
- `sample_tokens`: the step's drafts ride on its output to the engine core instead of a separate
  `take_draft_token_ids` round trip (engine/draft_handoff.py). A step of budget.gain's quiet
  stretch (nobody can draft, `TreeProposer.takes_quiet_step`) is sampled as vLLM's plain step:
  with the speculative config hidden, vLLM skips its drafting path (the drafter-fits check, the
  drafting call, the draft copy), which such a step only paid for.
- `compile_or_warm_up_model` (CPU worker and CUDA worker; the CPU one overrides the CUDA one):
  after vLLM's warm-up, the auto budget policy's startup profile of step time versus query
  tokens (engine/verify_profile.py).
All fall through to vLLM's code unchanged when the runner's drafter is not a TreeProposer.
"""
from __future__ import annotations

import time

from typing import Any, Callable

from vllm_treespec.engine.draft_handoff import attach_drafts
from vllm_treespec.engine.patch_registry import Patch, PatchRegistry
from vllm_treespec.engine.runner_state import (batch_has_seeded_sampling, step_batch, step_query_start,
                                               step_slot_mapping, step_to_sample)
from vllm_treespec.engine.tree_step import set_current_step

RUNNER = "vllm.v1.worker.gpu_model_runner:GPUModelRunner"

REGISTRY = PatchRegistry()


def _tree_proposer(runner: Any) -> Any:
    """The runner's TreeProposer, or None (every patch asks, several times a step: the class
    is imported once)."""
    global _TreeProposer
    if _TreeProposer is None:
        from vllm_treespec.engine.proposer import TreeProposer

        _TreeProposer = TreeProposer
    drafter = getattr(runner, "drafter", None)     # engine/runner_state.runner_drafter
    return drafter if isinstance(drafter, _TreeProposer) else None


_TreeProposer: Any = None


def _publish_plan(proposer: Any, step: Any) -> None:
    """This step's tree plan (None: withdrawn) for the patches, on the proposer, and for the
    attention backends, through the process global `tree_step.set_current_step`: vLLM constructs
    the backends' metadata builders and calls their forward with metadata it builds itself, so
    the plan cannot be handed to them along vLLM's metadata path."""
    if proposer is not None:
        proposer.plan = step
    set_current_step(step)


def _without_speculation(runner: Any, method: Callable[..., Any], *args: Any) -> Any:
    """`method(runner, *args)` with the runner's speculative config hidden: the vLLM 0.32 runner
    methods a free idle step calls take the plain path when it is None."""
    spec_config, runner.speculative_config = runner.speculative_config, None
    try:
        return method(runner, *args)
    finally:
        runner.speculative_config = spec_config


def _wrap_propose_draft_token_ids(original: Callable[..., Any]) -> Callable[..., Any]:
    def propose_draft_token_ids(self, scheduler_output, sampled_token_ids, sampling_metadata,
                                hidden_states, sample_hidden_states, aux_hidden_states,
                                spec_decode_metadata, common_attn_metadata, slot_mappings):
        proposer = _tree_proposer(self)
        if proposer is None:
            return original(self, scheduler_output, sampled_token_ids, sampling_metadata,
                            hidden_states, sample_hidden_states, aux_hidden_states,
                            spec_decode_metadata, common_attn_metadata, slot_mappings)
        return proposer.propose_step(self, scheduler_output, sampled_token_ids,
                                     hidden_states=hidden_states, aux_hidden_states=aux_hidden_states)

    return propose_draft_token_ids


def _wrap_update_states(original: Callable[..., Any]) -> Callable[..., Any]:
    def _update_states(self, scheduler_output):
        proposer = _tree_proposer(self)
        if proposer is not None and scheduler_output.finished_req_ids:
            proposer.on_requests_finished(scheduler_output.finished_req_ids, self)
        return original(self, scheduler_output)

    return _update_states


def _wrap_prepare_inputs(original: Callable[..., Any]) -> Callable[..., Any]:
    def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
        started = time.perf_counter()
        proposer = _tree_proposer(self)
        _publish_plan(proposer, None)
        if proposer is not None and not scheduler_output.scheduled_spec_decode_tokens:
            # free idle step: no request carries drafts, so vLLM prepares a plain step (no
            # spec-decode metadata, one logits row per request, its plain sampler); vLLM 0.32 keys
            # that on `speculative_config`, which only this call reads (see module docstring)
            result = _without_speculation(self, original, scheduler_output, num_scheduled_tokens)
            proposer.step_started_at = started
            proposer.plan_plain_step(step_query_start(self))
            return result
        result = original(self, scheduler_output, num_scheduled_tokens)
        if proposer is None:
            return result
        proposer.step_started_at = started
        plan_started = time.perf_counter()
        req_ids, query_start_loc, num_computed = step_batch(self)
        step = proposer.plan_step(req_ids, num_scheduled_tokens, scheduler_output.scheduled_spec_decode_tokens,
                                  query_start_loc, num_computed)
        if not step.chain_shaped:       # see TreeStep.chain_shaped
            self.positions[step.node_rows.to(self.positions.device)] = step.positions.to(self.positions.device)
            step.slot_mapping = step_slot_mapping(self, step.node_rows)
        step.plan_seconds = time.perf_counter() - plan_started
        _publish_plan(proposer, step)
        return result

    return _prepare_inputs


class _NoFullGraphs:
    """The runner's cudagraph dispatcher with FULL added to every dispatch's invalid modes."""

    def __init__(self, dispatcher: Any) -> None:
        self._dispatcher = dispatcher

    def dispatch(self, *args: Any, invalid_modes: Any = None, **kwargs: Any) -> Any:
        from vllm.config import CUDAGraphMode

        invalid = {CUDAGraphMode.FULL} | set(invalid_modes or ())
        return self._dispatcher.dispatch(*args, invalid_modes=invalid, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._dispatcher, name)


def _wrap_determine_batch_execution(original: Callable[..., Any]) -> Callable[..., Any]:
    def _determine_batch_execution_and_padding(self, *args, **kwargs):
        proposer = _tree_proposer(self)
        step = proposer.plan if proposer is not None else None
        if step is None or step.attn is None:
            return original(self, *args, **kwargs)
        dispatcher = self.cudagraph_dispatcher
        self.cudagraph_dispatcher = _NoFullGraphs(dispatcher)
        try:
            return original(self, *args, **kwargs)
        finally:
            self.cudagraph_dispatcher = dispatcher

    return _determine_batch_execution_and_padding


def _wrap_preprocess(original: Callable[..., Any]) -> Callable[..., Any]:
    def _preprocess(self, scheduler_output, num_input_tokens, intermediate_tensors=None):
        proposer = _tree_proposer(self)
        if proposer is None or not proposer.plain_step:
            return original(self, scheduler_output, num_input_tokens, intermediate_tensors)
        # a free idle step has no draft placeholders (-1) among its input ids to clamp
        return _without_speculation(self, original, scheduler_output, num_input_tokens, intermediate_tensors)

    return _preprocess


def _wrap_setup_aux(original: Callable[..., Any]) -> Callable[..., Any]:
    def _setup_eagle3_aux_hidden_state_outputs(self):
        proposer = _tree_proposer(self)
        # vLLM aux-hidden-state layer ids the drafter reads (id j = output of layer j - 1)
        layers = proposer.drafter.capabilities.aux_layers if proposer is not None else ()
        if not layers:
            return original(self)
        from vllm.model_executor.models.interfaces import supports_eagle3

        model = self.get_model()
        if not supports_eagle3(model):
            raise RuntimeError(
                f"treespec drafter {proposer.drafter.name!r} reads the target's hidden states, but "
                f"{type(model).__name__} cannot return intermediate layers (vLLM's EAGLE-3 "
                "interface); serve a model that supports it or choose a drafter without target features")
        self.use_aux_hidden_state_outputs = True
        model.set_aux_hidden_state_layers(tuple(layers))
        return None

    return _setup_eagle3_aux_hidden_state_outputs


def _wrap_input_fits_in_drafter(original: Callable[..., Any]) -> Callable[..., Any]:
    def _input_fits_in_drafter(self, common_attn_metadata):
        if _tree_proposer(self) is None:
            return original(self, common_attn_metadata)
        return common_attn_metadata is not None

    return _input_fits_in_drafter


def _wrap_sample(original: Callable[..., Any]) -> Callable[..., Any]:
    def _sample(self, logits, spec_decode_metadata):
        proposer = _tree_proposer(self)
        step = proposer.plan if proposer is not None else None
        _publish_plan(proposer, None)
        if proposer is not None and spec_decode_metadata is None and logits is not None \
                and proposer.plain_step:
            # a free idle step: vLLM samples; seeded sampled requests keep their own stream
            if not batch_has_seeded_sampling(self):
                return original(self, logits, None)
            return proposer.sample_plain(self, logits, lambda: original(self, logits, None))
        if proposer is None or step is None or spec_decode_metadata is None or logits is None:
            return original(self, logits, spec_decode_metadata)
        return proposer.sample(self, step, logits, lambda: original(self, logits, spec_decode_metadata))

    return _sample


def _wrap_sample_tokens(original: Callable[..., Any]) -> Callable[..., Any]:
    def sample_tokens(self, grammar_output):
        proposer = _tree_proposer(self)
        if proposer is None:
            return original(self, grammar_output)
        scheduler_output = step_to_sample(self)
        if scheduler_output is not None and proposer.takes_quiet_step(self, scheduler_output):
            # a step of budget.gain's quiet stretch: nobody drafts, so vLLM samples it as a
            # plain step (no drafting path); `execute_model` left the KV connector's
            # finalization to that path, so it is done here
            output = _without_speculation(self, original, grammar_output)
            self.finalize_kv_connector()
            proposer.take_quiet_step(output.sampled_token_ids)
            return attach_drafts(self, output, False)
        output = original(self, grammar_output)
        return attach_drafts(self, output, proposer.drafted)

    return sample_tokens


def _wrap_warm_up(original: Callable[..., Any]) -> Callable[..., Any]:
    def compile_or_warm_up_model(self):
        out = original(self)
        proposer = _tree_proposer(self.model_runner)
        if proposer is not None:
            proposer.profile_verify_cost(self.model_runner)
        return out

    return compile_or_warm_up_model


REGISTRY.register(Patch(
    target=f"{RUNNER}.propose_draft_token_ids",
    expected_signature=(
        "(self, scheduler_output: 'SchedulerOutput', sampled_token_ids: torch.Tensor | list[list[int]], "
        "sampling_metadata: vllm.v1.sample.metadata.SamplingMetadata, hidden_states: torch.Tensor, "
        "sample_hidden_states: torch.Tensor, aux_hidden_states: list[torch.Tensor] | None, "
        "spec_decode_metadata: vllm.v1.spec_decode.metadata.SpecDecodeMetadata | None, "
        "common_attn_metadata: vllm.v1.attention.backend.CommonAttentionMetadata, "
        "slot_mappings: dict[str, torch.Tensor] | list[dict[str, torch.Tensor]] | None) "
        "-> list[list[int]] | torch.Tensor"),
    make=_wrap_propose_draft_token_ids,
    why="give TreeProposer request ids, the scheduled budget and the runner's step state",
))
REGISTRY.register(Patch(
    target=f"{RUNNER}._update_states",
    expected_signature="(self, scheduler_output: 'SchedulerOutput') -> collections.abc.Callable | None",
    make=_wrap_update_states,
    why="free per-request drafter state when requests finish or are aborted",
))
REGISTRY.register(Patch(
    target=f"{RUNNER}._prepare_inputs",
    expected_signature=(
        "(self, scheduler_output: 'SchedulerOutput', num_scheduled_tokens: numpy.ndarray) -> "
        "tuple[torch.Tensor, vllm.v1.spec_decode.metadata.SpecDecodeMetadata | None, int]"),
    make=_wrap_prepare_inputs,
    why="tree rows get positions num_computed + depth; publish the step's tree plan",
))
REGISTRY.register(Patch(
    target=f"{RUNNER}._preprocess",
    expected_signature=(
        "(self, scheduler_output: 'SchedulerOutput', num_input_tokens: int, intermediate_tensors: "
        "vllm.sequence.IntermediateTensors | None = None) -> tuple[torch.Tensor | None, torch.Tensor | None, "
        "torch.Tensor, vllm.sequence.IntermediateTensors | None, dict[str, typing.Any], "
        "vllm.v1.outputs.ECConnectorOutput | None]"),
    make=_wrap_preprocess,
    why="a free idle step skips the clamp of draft placeholders in its input ids",
))
REGISTRY.register(Patch(
    target=f"{RUNNER}._determine_batch_execution_and_padding",
    expected_signature=(
        "(self, num_tokens: int, num_reqs: int, num_scheduled_tokens_np: numpy.ndarray, "
        "max_num_scheduled_tokens: int, use_cascade_attn: bool = False, "
        "allow_microbatching: bool = True, force_eager: bool = False, "
        "force_uniform_decode: bool | None = None, force_has_lora: bool | None = None, "
        "force_num_active_loras: int | None = None, num_encoder_reqs: int = 0) -> "
        "tuple[vllm.config.compilation.CUDAGraphMode, vllm.forward_context.BatchDescriptor, "
        "bool, torch.Tensor | None, vllm.compilation.cuda_graph.CUDAGraphStat | None]"),
    make=_wrap_determine_batch_execution,
    why="steps with branching trees never replay a FULL CUDA graph (tree rows are overwritten "
        "outside it)",
))
REGISTRY.register(Patch(
    target=f"{RUNNER}._setup_eagle3_aux_hidden_state_outputs",
    expected_signature="(self) -> None",
    make=_wrap_setup_aux,
    why="drafters that read target features (DART heads) get the target's aux hidden states",
))
REGISTRY.register(Patch(
    target=f"{RUNNER}._input_fits_in_drafter",
    expected_signature=("(self, common_attn_metadata: vllm.v1.attention.backend.CommonAttentionMetadata | None) "
                        "-> bool"),
    make=_wrap_input_fits_in_drafter,
    why="requests near max_model_len get their own capped drafts, not num_speculative_tokens zeros "
        "for the whole batch",
))
REGISTRY.register(Patch(
    target=f"{RUNNER}._sample",
    expected_signature=(
        "(self, logits: torch.Tensor | None, spec_decode_metadata: "
        "vllm.v1.spec_decode.metadata.SpecDecodeMetadata | None) -> vllm.v1.outputs.SamplerOutput"),
    make=_wrap_sample,
    why="tree acceptance and KV compaction instead of the linear rejection sampler",
))
REGISTRY.register(Patch(
    target=f"{RUNNER}.sample_tokens",
    expected_signature=(
        "(self, grammar_output: 'GrammarOutput | None') -> vllm.v1.outputs.ModelRunnerOutput | "
        "vllm.v1.outputs.AsyncModelRunnerOutput | vllm.sequence.IntermediateTensors"),
    make=_wrap_sample_tokens,
    why="send the step's drafts with its output instead of a take_draft_token_ids round trip",
))
for _worker in ("vllm.v1.worker.cpu_worker:CPUWorker", "vllm.v1.worker.gpu_worker:Worker"):
    REGISTRY.register(Patch(
        target=f"{_worker}.compile_or_warm_up_model",
        expected_signature="(self) -> vllm.v1.worker.worker_base.CompilationTimes",
        make=_wrap_warm_up,
        why="budget.mode auto: profile the target's step time per query tokens before serving",
    ))
