"""Drafts ride on the step's output instead of a third round trip to the worker.

vLLM 0.32.0's engine core asks the worker for the next step's drafts after every step
(`EngineCore.post_step` -> `executor.take_draft_token_ids()`); with the multiprocess executor
(vLLM's default, also on CPU) that is one more RPC through the shared-memory queues: the engine
core enqueues, the worker wakes, answers, the engine core wakes. Served on the 2-core VM that
round trip showed in a profile of the engine core under 8 sampled clients with nothing drafted
(`benchmarks/profile_serving.py`; docs/never-slower.md section 1), on top of the two RPCs a
step without speculation pays (`execute_model`, `sample_tokens`).

A treespec worker already has the drafts when `sample_tokens` returns (the proposer runs inside
it in vLLM's synchronous scheduling, the only mode custom proposers get), so:
- worker side (a runner patch, engine/runner_patches.py): `sample_tokens` attaches
  `take_draft_token_ids()`'s answer to the `ModelRunnerOutput` it returns, as the attribute
  `ATTR` (None when nothing is drafted), pickled with the output;
- engine-core side (this module's `REGISTRY`, installed by the plugin's `register()` in the
  process that owns the executor): `MultiprocExecutor.sample_tokens` takes the attribute off the
  output and keeps it; the next `take_draft_token_ids()` returns it without an RPC.
An output without the attribute (no treespec worker, a non-blocking call, an empty output) leaves
the executor on vLLM's path unchanged, so the engine-core patch is inert for every other config.
"""
from __future__ import annotations

from typing import Any, Callable

from vllm_treespec.engine.patch_registry import Patch, PatchRegistry
from vllm_treespec.engine.runner_state import take_drafts

ATTR = "treespec_draft_token_ids"      # DraftTokenIds | None, set by a treespec worker
_STASH = "_treespec_draft_token_ids"   # on the executor: a 1-tuple until taken

EXECUTOR = "vllm.v1.executor.multiproc_executor:MultiprocExecutor"

REGISTRY = PatchRegistry()


def attach_drafts(runner: Any, output: Any) -> Any:
    """Worker side: put this step's drafts on `output` (a ModelRunnerOutput built for this step)."""
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

    if type(output) is ModelRunnerOutput and output is not EMPTY_MODEL_RUNNER_OUTPUT:
        drafts = take_drafts(runner)
        if drafts is not None and not any(drafts.draft_token_ids):
            # nobody drafted: the engine core then skips `update_draft_token_ids`, a loop over
            # every request that would only set what scheduling the step already cleared
            # (`Scheduler.schedule` empties each scheduled request's spec_token_ids)
            drafts = None
        setattr(output, ATTR, drafts)
    return output


def keep_drafts(executor: Any, output: Any) -> None:
    """Engine-core side: move attached drafts from a step's output onto the executor."""
    state = getattr(output, "__dict__", None)
    if state is not None and ATTR in state:
        setattr(executor, _STASH, (state.pop(ATTR),))


def _wrap_sample_tokens(original: Callable[..., Any]) -> Callable[..., Any]:
    def sample_tokens(self, grammar_output, non_block=False):
        self.__dict__.pop(_STASH, None)     # drafts belong to the step that produced them
        output = original(self, grammar_output, non_block)
        if not non_block:
            keep_drafts(self, output)
        return output

    return sample_tokens


def _wrap_take_draft_token_ids(original: Callable[..., Any]) -> Callable[..., Any]:
    def take_draft_token_ids(self):
        kept = self.__dict__.pop(_STASH, None)
        if kept is not None:
            return kept[0]
        return original(self)

    return take_draft_token_ids


REGISTRY.register(Patch(
    target=f"{EXECUTOR}.sample_tokens",
    expected_signature=(
        "(self, grammar_output: vllm.v1.core.sched.output.GrammarOutput | None, non_block: bool = False) "
        "-> vllm.v1.outputs.ModelRunnerOutput | concurrent.futures._base.Future[vllm.v1.outputs.ModelRunnerOutput]"),
    make=_wrap_sample_tokens,
    why="keep the drafts a treespec worker attached to the step's output",
))
REGISTRY.register(Patch(
    target=f"{EXECUTOR}.take_draft_token_ids",
    expected_signature="(self) -> vllm.v1.outputs.DraftTokenIds | None",
    make=_wrap_take_draft_token_ids,
    why="answer the engine core's draft request from the kept drafts, without an RPC",
))


def install() -> None:
    """Install the engine-core half once per process; a vLLM whose executor differs keeps its RPC
    (the worker half then attaches drafts nobody takes off: harmless, and activate() reports the
    version)."""
    if any(REGISTRY.is_installed(p.target) for p in REGISTRY.patches) or REGISTRY.signature_mismatches():
        return
    for patch in REGISTRY.patches:
        REGISTRY.install(patch)
