"""The proposer's request table (engine/request_table.py) and its reads of vLLM's runner
(engine/runner_state.py), without an engine."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from vllm_treespec.drafters import Proposal
from vllm_treespec.engine.request_table import RequestTable
from vllm_treespec.tree import DraftTree


def _runner(requests: dict) -> SimpleNamespace:
    return SimpleNamespace(requests=requests)


def test_drafts_are_recorded_per_request_and_cleared_when_none_come():
    table = RequestTable()
    chain = DraftTree.chain(3, [4, 5])
    q = object()
    drafts = table.record_drafts(["a", "b", "c"], Proposal([chain, DraftTree.root_only(7), chain], {0: q}),
                                 decoding=[True, True, False], caps=[2, 2, 0])
    assert drafts == [[4, 5], [], [4, 5]]
    assert table.trees["a"] is chain and table.draft_probs["a"] is q and "b" not in table.trees
    assert (table["a"].steps, table["a"].drafted, table["a"].budget_given) == (1, 2, 2)
    assert table["c"].steps == 0                    # a tree without a decode step counts nothing
    assert table.record_drafts(["a", "b"], None, decoding=[True, False], caps=[0, 0]) == [[], []]
    assert len(table.trees) == 1 and set(table.trees) == {"c"} and len(table.draft_probs) == 0
    assert (table["a"].steps, table["a"].budget_given) == (2, 0)


def test_requests_without_decode_or_drafts_get_no_record():
    table = RequestTable()
    table.record_drafts(["p"], Proposal([DraftTree.root_only(1)]), decoding=[False], caps=[0])
    assert "p" not in table and len(table) == 0


def test_fields_act_as_mappings_and_release_drops_everything():
    table = RequestTable()
    table.generators["s"] = "gen"                   # tree acceptance stores its generator so
    assert table.generators.get("s") == "gen" and table.generators.get("x") is None and "s" in table
    del table.generators["s"]
    with pytest.raises(KeyError):
        del table.generators["s"]
    table.trees["s"] = DraftTree.chain(1, [2])
    table.release(["s", "never-seen"])
    assert len(table) == 0 and len(table.trees) == 0 and len(table.generators) == 0


def test_release_frees_the_requests_budget_records():
    """A request's budget state lives in its record: made on first use, kept across steps, and
    freed with the record (no rule holds on to it)."""
    import gc
    import weakref

    from vllm_treespec.budget.gain import GainControl, GainCosts
    from vllm_treespec.budget.reach import ReachCap

    reach, gain = ReachCap(0.3, max_depth=4), GainControl(4)
    table = RequestTable()
    st = table.state("r")
    assert st.reach is None and st.gain is None
    records = (st.reach_record(reach), st.gain_record(gain))
    assert records == (st.reach_record(reach), st.gain_record(gain)) == (st.reach, st.gain)
    reach.observe([st.reach], [4], [1])
    gain.begin_step()
    gain.decide(st.gain, 4, costs=GainCosts(0.1, 1.0, 1.0), cls="T0.7")
    gain.observe_trees([st.gain], [4], [1])
    refs = [weakref.ref(r) for r in records]
    del st, records
    table.release(["r"])
    gc.collect()
    assert [r() for r in refs] == [None, None]


def test_fixed_options_are_read_once_and_min_tokens_each_step():
    from vllm import SamplingParams

    table = RequestTable()
    runner = _runner({"a": SimpleNamespace(sampling_params=SamplingParams(min_tokens=2, seed=1, temperature=0.9),
                                           output_token_ids=[1])})
    assert table.blocker("a", runner) == "min_tokens"
    st = table["a"]
    assert st.options_checked and st.blocker is None and st.seeded_sampled and st.gain_class is None
    runner.requests["a"].output_token_ids = [1, 2]
    runner.requests["a"].sampling_params = SamplingParams(logprobs=1)      # not read again
    assert table.blocker("a", runner) is None
    assert table.blocker("gone", runner) is None and table.blocker("x", None) is None


def test_runner_reads_answer_none_for_unknown_requests():
    from vllm import SamplingParams

    from vllm_treespec.engine import runner_state

    params = SamplingParams(max_tokens=9, temperature=0.5)
    runner = _runner({"a": SimpleNamespace(sampling_params=params, num_prompt_tokens=4, output_token_ids=[1])})
    assert runner_state.request_params(runner, "a") is params and runner_state.request_params(None, "a") is None
    assert runner_state.request_temperature(runner, "a") == 0.5
    assert runner_state.request_progress(runner, "a") == (params, 1)
    assert runner_state.request_progress(runner, "b") is None
    assert runner_state.request_limits(runner, "a") == (9, 4) and runner_state.request_limits(runner, "b") is None
    assert runner_state.total_scheduled_tokens(SimpleNamespace()) == 0


def test_finished_outputs_are_the_rows_output_tokens():
    from vllm_treespec.engine.runner_state import finished_outputs

    buf = np.arange(20, dtype=np.int32).reshape(2, 10)
    batch = SimpleNamespace(req_id_to_index={"a": 1}, token_ids_cpu=buf, num_prompt_tokens=np.array([0, 3]),
                            num_tokens_no_spec=np.array([0, 6]))
    out = finished_outputs(SimpleNamespace(input_batch=batch), ["gone", "a"])
    assert [o.tolist() for o in out] == [[13, 14, 15]]
