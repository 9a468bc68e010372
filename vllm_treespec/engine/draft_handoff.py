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
- engine-core side (this module's `REGISTRY`, installed in the process that owns the executor:
  by the plugin's `register()` for `MultiprocExecutor`, by `activate()` for the in-process
  `UniProcExecutor` of offline `LLM` use): the executor's `sample_tokens` takes the attribute off
  the output and keeps it; the next `take_draft_token_ids()` returns it without asking the worker
  again.
An output without the attribute (no treespec worker, a non-blocking call, an empty output) leaves
the executor on vLLM's path unchanged, so the engine-core patch is inert for every other config.
"""
from __future__ import annotations

import sys
import threading
from typing import Any, Callable

from vllm_treespec.engine.patch_registry import Patch, PatchRegistry
from vllm_treespec.engine.runner_state import take_drafts

ATTR = "treespec_draft_token_ids"      # DraftTokenIds | None, set by a treespec worker
_STASH = "_treespec_draft_token_ids"   # on the executor: a 1-tuple until taken

EXECUTOR = "vllm.v1.executor.multiproc_executor:MultiprocExecutor"
UNIPROC_EXECUTOR = "vllm.v1.executor.uniproc_executor:UniProcExecutor"

REGISTRY = PatchRegistry()
_install_lock = threading.Lock()


_outputs: tuple[type, Any] | None = None      # vLLM's (ModelRunnerOutput, EMPTY_MODEL_RUNNER_OUTPUT)


def attach_drafts(runner: Any, output: Any, drafted: bool = True) -> Any:
    """Worker side: put this step's drafts on `output` (a ModelRunnerOutput built for this step);
    `drafted` False: the proposer drafted nothing this step, so the drafts are None without
    asking the runner for them."""
    global _outputs
    if _outputs is None:
        from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, ModelRunnerOutput

        _outputs = ModelRunnerOutput, EMPTY_MODEL_RUNNER_OUTPUT
    if type(output) is _outputs[0] and output is not _outputs[1]:
        drafts = take_drafts(runner) if drafted else None
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


# The executors whose engine core takes drafts by `take_draft_token_ids()` after every step, with
# the signature each was written for: MultiprocExecutor (served: an RPC through the shared-memory
# queues) and UniProcExecutor (offline `LLM` with the engine in-process: a second call into the
# worker, which answers the same drafts again and makes the scheduler update from them).
EXECUTORS = {
    EXECUTOR: (
        "(self, grammar_output: vllm.v1.core.sched.output.GrammarOutput | None, non_block: bool = False) "
        "-> vllm.v1.outputs.ModelRunnerOutput | concurrent.futures._base.Future[vllm.v1.outputs.ModelRunnerOutput]"),
    UNIPROC_EXECUTOR: (
        "(self, grammar_output: vllm.v1.core.sched.output.GrammarOutput | None, non_block: bool = False) "
        "-> vllm.v1.outputs.ModelRunnerOutput | None | "
        "concurrent.futures._base.Future[vllm.v1.outputs.ModelRunnerOutput | None]"),
}
for _executor, _signature in EXECUTORS.items():
    REGISTRY.register(Patch(
        target=f"{_executor}.sample_tokens",
        expected_signature=_signature,
        make=_wrap_sample_tokens,
        why="keep the drafts a treespec worker attached to the step's output",
    ))
    REGISTRY.register(Patch(
        target=f"{_executor}.take_draft_token_ids",
        expected_signature="(self) -> vllm.v1.outputs.DraftTokenIds | None",
        make=_wrap_take_draft_token_ids,
        why="answer the engine core's draft request from the kept drafts, without an RPC",
    ))


def install() -> None:
    """Install the engine-core half, once per process, for each executor whose module this
    process imported (the plugin's `register()` for the multiprocess executor, `activate()` for
    the in-process one, which lives in the worker's process). An executor whose signatures
    differ keeps vLLM's path (the worker half then attaches drafts nobody takes off: harmless,
    and activate() reports the version)."""
    with _install_lock:
        for executor in EXECUTORS:
            if executor.partition(":")[0] not in sys.modules:
                continue
            patches = [p for p in REGISTRY.patches if p.target.startswith(executor + ".")]
            if any(REGISTRY.is_installed(p.target) for p in patches) or REGISTRY.signature_mismatches(patches):
                continue
            for patch in patches:
                REGISTRY.install(patch)
