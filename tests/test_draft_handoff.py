"""The draft handoff: drafts attached to a step's output replace the engine core's extra RPC."""
from __future__ import annotations

import pickle

import pytest

pytest.importorskip("vllm")

from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, DraftTokenIds, ModelRunnerOutput  # noqa: E402

from vllm_treespec.engine import draft_handoff  # noqa: E402
from vllm_treespec.engine.draft_handoff import ATTR, attach_drafts  # noqa: E402


def test_executor_patches_match_this_vllm():
    assert draft_handoff.REGISTRY.signature_mismatches() == []


class _Runner:
    def __init__(self, drafts):
        self.drafts = drafts

    def take_draft_token_ids(self):
        return self.drafts


class _Executor:
    """Stands in for MultiprocExecutor: records how often the RPC path is taken."""

    def __init__(self, outputs):
        self.outputs = list(outputs)
        self.rpc_calls = 0

    def _sample_rpc(self, grammar_output, non_block=False):
        return self.outputs.pop(0)

    def _take_rpc(self):
        self.rpc_calls += 1
        return "from-rpc"


def _patched(executor: _Executor):
    sample = draft_handoff._wrap_sample_tokens(type(executor)._sample_rpc)
    take = draft_handoff._wrap_take_draft_token_ids(type(executor)._take_rpc)
    return (lambda non_block=False: sample(executor, None, non_block)), (lambda: take(executor))


def _output(**attrs) -> ModelRunnerOutput:
    out = ModelRunnerOutput(req_ids=["a"], req_id_to_index={"a": 0})
    for k, v in attrs.items():
        setattr(out, k, v)
    return out


def test_attached_drafts_survive_the_queue_and_replace_the_rpc():
    drafts = DraftTokenIds(["a"], [[5, 6]])
    out = attach_drafts(_Runner(drafts), _output())
    out = pickle.loads(pickle.dumps(out))           # what the worker's response queue does
    executor = _Executor([out])
    sample, take = _patched(executor)
    returned = sample()
    assert ATTR not in returned.__dict__            # taken off before the scheduler sees it
    got = take()
    assert (got.req_ids, got.draft_token_ids) == (["a"], [[5, 6]]) and executor.rpc_calls == 0
    assert take() == "from-rpc" and executor.rpc_calls == 1     # kept drafts are used once


def test_nothing_drafted_is_answered_without_rpc():
    """No drafts (None, or an empty list for every request) reach the engine core as None, so
    its post_step skips the scheduler's update loop."""
    for drafts in (None, DraftTokenIds(["a", "b"], [[], []])):
        executor = _Executor([attach_drafts(_Runner(drafts), _output())])
        sample, take = _patched(executor)
        sample()
        assert take() is None and executor.rpc_calls == 0


def test_a_step_that_drafted_nothing_does_not_ask_the_runner():
    class _NoAsk:
        def take_draft_token_ids(self):
            raise AssertionError("asked for drafts the proposer did not make")

    out = attach_drafts(_NoAsk(), _output(), drafted=False)
    assert out.__dict__[ATTR] is None


def test_the_offline_executor_is_covered_too():
    """Offline `LLM` use runs UniProcExecutor in the worker's process: its engine core asked the
    worker for the drafts a second time after every step."""
    targets = {p.target for p in draft_handoff.REGISTRY.patches}
    for executor in draft_handoff.EXECUTORS:
        assert {f"{executor}.sample_tokens", f"{executor}.take_draft_token_ids"} <= targets


def test_outputs_without_drafts_keep_vllms_path():
    executor = _Executor([_output(**{ATTR: DraftTokenIds(["a"], [[1]])}), _output(), _output()])
    sample, take = _patched(executor)
    sample()
    sample()                    # a later step without attached drafts drops the earlier ones
    assert take() == "from-rpc" and executor.rpc_calls == 1
    sample(non_block=True)      # futures (batch queue) are left alone
    assert take() == "from-rpc" and executor.rpc_calls == 2


def test_the_shared_empty_output_is_never_marked():
    attach_drafts(_Runner(DraftTokenIds([], [])), EMPTY_MODEL_RUNNER_OUTPUT)
    assert ATTR not in EMPTY_MODEL_RUNNER_OUTPUT.__dict__
