"""TreeProposer lifecycle without an engine: budgets, per-request state, finish/abort cleanup."""
from __future__ import annotations

import time
from types import SimpleNamespace

import numpy as np
import torch
import pytest

from vllm_treespec.config import ConfigError


def _vllm_config(k=4, treespec=None, max_model_len=64):
    return SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=k),
        additional_config={} if treespec is None else {"treespec": treespec},
        model_config=SimpleNamespace(max_model_len=max_model_len, tokenizer=None,
                                     get_vocab_size=lambda: 4096),   # as vLLM's ModelConfig
        scheduler_config=SimpleNamespace(max_num_batched_tokens=2048, max_num_seqs=8),
        parallel_config=SimpleNamespace(tensor_parallel_size=1),
    )


def _runner(rows: list[list[int]], req_ids: list[str], width: int = 64):
    buf = np.zeros((8, width), dtype=np.int32)
    for i, r in enumerate(rows):
        buf[i, : len(r)] = r
    batch = SimpleNamespace(req_ids=req_ids, token_ids_cpu=buf,
                            num_tokens_no_spec=np.array([len(r) for r in rows] + [0] * (8 - len(rows)), dtype=np.int32))
    return SimpleNamespace(input_batch=batch)


def _sched(budget=0):
    return SimpleNamespace(num_spec_tokens_to_schedule=budget, finished_req_ids=set())


@pytest.fixture()
def proposer():
    from vllm_treespec.engine.proposer import TreeProposer

    return TreeProposer(_vllm_config(k=4, treespec="prompt-lookup"))   # drafts follow the row's own text


def test_drafts_follow_budget_and_skip_non_decoding_rows(proposer):
    rows = [[1, 2, 3, 9, 1, 2, 3], [4, 5, 4, 5, 4]]
    runner = _runner(rows, ["a", "b"])
    drafts = proposer.propose_step(runner, _sched(), [[3], []])  # b is mid-prefill: no draft
    assert drafts == [[9, 1, 2, 3], []]
    assert proposer.propose_step(runner, _sched(budget=2), [[3], [4]]) == [[9, 1], [5, 4]]
    assert set(proposer.requests) == {"a", "b"}


def test_budget_never_passes_max_model_len():
    from vllm_treespec.engine.proposer import TreeProposer

    p = TreeProposer(_vllm_config(k=4, max_model_len=9))
    runner = _runner([[1, 2, 3, 9, 1, 2, 3]], ["a"])
    assert p.propose_step(runner, _sched(), [[3]]) == [[9, 1]]


def test_drafts_stop_where_max_tokens_would_cut_them(proposer):
    """Nodes past max_tokens would be verified rows whose tokens are cut (and counted as
    accepted by vLLM's counters): a request with 3 tokens left gets at most 2 drafts."""
    from vllm import SamplingParams

    runner = _runner([[1, 2, 3, 9, 1, 2, 3]], ["a"])
    runner.requests = {"a": SimpleNamespace(sampling_params=SamplingParams(max_tokens=5), num_prompt_tokens=5,
                                            output_token_ids=[2, 3])}
    assert proposer.propose_step(runner, _sched(), [[3]]) == [[9, 1]]
    runner.requests["a"].sampling_params = SamplingParams(max_tokens=3)      # the last token is next
    assert proposer.propose_step(runner, _sched(), [[3]]) == [[]]
    runner.requests["a"].sampling_params = SamplingParams(max_tokens=100)
    assert proposer.propose_step(runner, _sched(), [[3]]) == [[9, 1, 2, 3]]


def test_trees_are_kept_per_request_and_freed_on_finish(proposer):
    runner = _runner([[1, 2, 3, 9, 1, 2, 3]], ["a"])
    assert proposer.propose_step(runner, _sched(), [[3]]) == [[9, 1, 2, 3]]
    tree = proposer.requests.trees["a"]
    assert tree.tokens.tolist() == [3, 9, 1, 2, 3] and tree.parents.tolist() == [-1, 0, 1, 2, 3]
    st = proposer.requests["a"]
    assert (st.steps, st.drafted) == (1, 4)
    runner = _runner([[5, 6, 7]], ["a"])                               # nothing to draft now
    assert proposer.propose_step(runner, _sched(), [[7]]) == [[]]
    assert "a" not in proposer.requests.trees                            # no stale tree left
    proposer.on_requests_finished({"a", "never-seen"})
    assert len(proposer.requests) == 0 and len(proposer.requests.trees) == 0


@pytest.mark.parametrize("budget", [{"reach_floor": 0.0}, {"reach_floor": 0.2},
                                    {"reach_floor": 0.2, "gain": {"enabled": True}}])
def test_finishing_requests_that_hold_trees_and_q_rows_frees_every_table(budget):
    """Several requests finished at once while each still holds its last tree and q rows (what a
    request has when it finishes mid-draft) and, after a verified step, its budget rules' state:
    nothing of theirs may stay behind, reach and gain on or off."""
    import gc
    import weakref

    from vllm_treespec.engine.proposer import TreeProposer

    p = TreeProposer(_vllm_config(k=4, treespec={"drafter": {"type": "prompt_lookup"}, "budget": budget}))
    ids = ["a", "b", "c"]
    runner = _runner([[1, 2, 3, 9, 1, 2, 3]] * 3, ids)
    assert p.propose_step(runner, _sched(), [[3]] * 3) == [[9, 1, 2, 3]] * 3
    step = p.plan_step(ids, np.array([5] * 3), {r: [9, 1, 2, 3] for r in ids}, np.array([0, 5, 10, 15]),
                       np.array([7] * 3))
    p.budget.observe_verified(p.requests, step, [1, 4, 0], [4] * 3)     # what the rules learn from it
    records = [r for st in p.requests.values() for r in (st.reach, st.gain) if r is not None]
    assert len(records) == 3 * ((budget["reach_floor"] > 0) + ("gain" in budget))
    refs = [weakref.ref(r) for r in records]
    del records
    for r in ids:
        p.requests.draft_probs[r] = object()   # a sampled tree's q rows, as a sampling drafter leaves
    assert set(p.requests.trees) == set(ids)
    p.on_requests_finished(["a", "c"])
    assert set(p.requests.trees) == {"b"} and set(p.requests.draft_probs) == {"b"} and set(p.requests) == {"b"}
    p.on_requests_finished(["b", "never-seen"])
    assert all(n == 0 for n in p.tracked_requests().values()), p.tracked_requests()
    gc.collect()
    assert all(ref() is None for ref in refs)           # the budget rules keep no request's state


def test_requests_with_options_trees_cannot_honour_get_no_drafts(proposer):
    from vllm import SamplingParams

    runner = _runner([[1, 2, 3, 9, 1, 2, 3], [1, 2, 3, 9, 1, 2, 3]], ["plain", "logprobs"])
    runner.requests = {
        "plain": SimpleNamespace(sampling_params=SamplingParams(temperature=0.8), output_token_ids=[1]),
        "logprobs": SimpleNamespace(sampling_params=SamplingParams(logprobs=2), output_token_ids=[1]),
    }
    assert proposer.propose_step(runner, _sched(), [[3], [3]]) == [[9, 1, 2, 3], []]
    assert proposer.requests["logprobs"].fallback_steps == {"logprobs": 1}
    runner.requests["plain"] = SimpleNamespace(sampling_params=SamplingParams(min_tokens=3),
                                               output_token_ids=[1])
    proposer.requests.release(["plain"])
    assert proposer.propose_step(runner, _sched(), [[3], [3]])[0] == []      # min_tokens pending
    runner.requests["plain"].output_token_ids = [1, 2, 3]
    assert proposer.propose_step(runner, _sched(), [[3], [3]])[0] == [9, 1, 2, 3]


def test_runner_patch_routes_to_proposer_and_frees_on_finish(proposer):
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    runner = _runner([[1, 2, 1, 2]], ["a"])
    runner.drafter = proposer
    out = GPUModelRunner.propose_draft_token_ids(runner, _sched(), [[2]], None, None, None, None, None, None, None)
    assert out == [[1, 2]]


    from vllm_treespec.engine.runner_patches import REGISTRY

    patch = next(p for p in REGISTRY.patches if p.target.endswith("._update_states"))
    seen = []
    update_states = patch.make(lambda self, so: seen.append(so) or "vllm-result")
    so = SimpleNamespace(finished_req_ids={"a"})
    assert update_states(runner, so) == "vllm-result" and seen == [so]
    assert "a" not in proposer.requests


def test_the_proposer_says_whether_its_step_drafted(proposer):
    """The sample_tokens patch attaches no drafts without asking the runner when it did not."""
    runner = _runner([[1, 2, 3, 9, 1, 2, 3]], ["a"])
    assert proposer.propose_step(runner, _sched(), [[3]]) == [[9, 1, 2, 3]] and proposer.drafted
    assert proposer.propose_step(runner, _sched(), [[]]) == [[]] and not proposer.drafted   # not decoding


def test_free_idle_steps_skip_the_placeholder_clamp(proposer):
    """vLLM clamps draft placeholders in the input ids whenever speculation is configured; the
    `_preprocess` patch hides the speculative config from it on a free idle step only."""
    from vllm_treespec.engine.runner_patches import REGISTRY

    patch = next(p for p in REGISTRY.patches if p.target.endswith("._preprocess"))
    seen = []
    preprocess = patch.make(lambda self, so, n, it=None: seen.append(self.speculative_config) or "vllm-result")
    runner = SimpleNamespace(drafter=proposer, speculative_config="spec")
    proposer.plain_step = True
    assert preprocess(runner, None, 4) == "vllm-result" and seen == [None]
    assert runner.speculative_config == "spec"                      # restored
    proposer.plain_step = False                                     # a step that verifies drafts
    preprocess(runner, None, 4)
    assert seen == [None, "spec"]


def test_bad_config_fails_construction():
    from vllm_treespec.engine.proposer import TreeProposer

    with pytest.raises(ConfigError, match="budget.max_nodes"):
        TreeProposer(_vllm_config(k=4, treespec={"drafter": {"type": "prompt_lookup"}, "budget": {"max_nodes": 5}}))


def test_finished_requests_outputs_reach_online_drafters(proposer):
    from vllm_treespec.drafters import DrafterCapabilities

    seen = []
    proposer.drafter.capabilities = DrafterCapabilities(observes_output=True)
    proposer.drafter.observe_output = lambda tokens: seen.append(tokens.tolist())
    runner = _runner([[1, 2, 3, 4, 5]], ["a"])
    runner.input_batch.req_id_to_index = {"a": 0}
    runner.input_batch.num_prompt_tokens = np.array([2] + [0] * 7)
    proposer.on_requests_finished(["a", "gone"], runner)
    assert seen == [[3, 4, 5]]  # output tokens only, read before vLLM drops the row


def test_drafters_that_ask_get_target_states_with_committed_rows(proposer):
    from vllm_treespec.drafters import DrafterCapabilities
    from vllm_treespec.engine.tree_step import plan_tree_step
    from vllm_treespec.tree import DraftTree

    tree = DraftTree([7, 4, 5, 6], [-1, 0, 0, 2])
    step = plan_tree_step(["a", "b"], np.array([4, 3]), {"a": [4, 5, 6]}, {"a": tree},
                          np.array([0, 4, 7]), np.array([10, 0]))   # b: a 3-token prefill chunk
    proposer.committed.verified(step, np.array([[2, 3, -1, -1]]))   # a accepted nodes 2 then 3
    seen = []
    proposer.drafter.capabilities = DrafterCapabilities(uses_target_states=True)
    original = proposer.drafter.propose
    proposer.drafter.propose = lambda inputs: seen.append(inputs.target) or original(inputs)
    runner = _runner([[1, 2, 3, 9, 1, 2, 3], [4, 5, 4]], ["a", "b"])
    runner.positions = torch.as_tensor(np.concatenate([step.positions.numpy(), [0, 1, 2]]))
    proposer.propose_step(runner, _sched(), [[3], [4]], hidden_states="H", aux_hidden_states=None)
    target = seen[0]
    assert target.hidden == "H" and target.aux is None
    assert [r.tolist() for r in target.rows] == [[0, 2, 3], [4, 5, 6]]
    # a's accepted path (nodes 2, 3 at depths 1, 2) sits at contiguous positions after its root
    assert [p.tolist() for p in target.positions] == [[10, 11, 12], [0, 1, 2]]


def test_reach_floor_caps_each_request_from_its_acceptance():
    """budget.reach_floor: a request whose drafts are rarely accepted gets shallower drafts, the
    others keep their budget; its state is freed on finish."""
    from vllm import SamplingParams

    from vllm_treespec.engine.proposer import TreeProposer

    p = TreeProposer(_vllm_config(k=4, treespec={"drafter": {"type": "prompt_lookup"},
                                                 "budget": {"reach_floor": 0.2}}))
    rows = [[1, 2, 3, 9, 1, 2, 3], [1, 2, 3, 9, 1, 2, 3]]
    runner = _runner(rows, ["greedy", "sampled"])
    runner.requests = {
        "greedy": SimpleNamespace(sampling_params=SamplingParams(temperature=0.0), output_token_ids=[1]),
        "sampled": SimpleNamespace(sampling_params=SamplingParams(temperature=0.8), output_token_ids=[1]),
    }
    assert p.propose_step(runner, _sched(), [[3], [3]]) == [[9, 1, 2, 3]] * 2   # nothing learnt yet
    assert {r: p.requests[r].reach_class for r in p.requests} == {"greedy": "greedy", "sampled": "sampled"}
    records = [p.requests[r].reach_record(p.budget.reach) for r in ("sampled", "greedy")]
    for _ in range(50):                    # sampled drafts: first node rejected; greedy: all accepted
        p.budget.reach.observe(records, [4, 4], [0, 4])
    assert [p.budget.reach.cap(p.requests[r].reach) for r in ("greedy", "sampled")] == [4, 1]
    assert p.budget.reach_means(p.requests) == {"greedy": 4.0, "sampled": 1.0}
    assert p.propose_step(runner, _sched(), [[3], [3]]) == [[9, 1, 2, 3], [9]]
    p.on_requests_finished({"greedy", "sampled"})
    assert len(p.requests) == 0 and p.tracked_requests() == {"requests": 0}


def test_reach_floor_off_by_default(proposer):
    assert proposer.budget.reach is None


def test_confidence_mode_keeps_what_the_rated_nodes_pay_for_and_learns_from_verification():
    """budget.gain.confidence: every unseeded request drafts, its tree is cut to the nodes whose
    calibrated rating pays for their rows (all of them while rows are free, none when a row costs
    more than any node is worth), and verification calibrates the ratings."""
    from vllm_treespec.budget.gain import GainCosts

    from vllm_treespec.engine.proposer import TreeProposer

    p = TreeProposer(_vllm_config(k=4, treespec={"drafter": {"type": "prompt_lookup"},
                                                 "budget": {"gain": {"enabled": True, "confidence": True}}}))
    from vllm import SamplingParams

    ids = ["a", "b"]
    runner = _runner([[1, 2, 3, 9, 1, 2, 3]] * 2, ids)
    runner.requests = {r: SimpleNamespace(sampling_params=SamplingParams(temperature=0.0), output_token_ids=[1])
                       for r in ids}
    assert p.propose_step(runner, _sched(), [[3]] * 2) == [[9, 1, 2, 3]] * 2
    assert p.requests["a"].rated[0].shape == (4,) and p.requests["a"].rated[0][0] > 0
    step = p.plan_step(ids, np.array([5] * 2), {r: [9, 1, 2, 3] for r in ids}, np.array([0, 5, 10]),
                       np.array([7] * 2))
    accepted_nodes = np.array([[1, 2, -1, -1], [-1, -1, -1, -1]])
    p.budget.observe_verified(p.requests, step, [2, 0], [4, 4], accepted_nodes)
    assert p.budget.calibration.observed("greedy").sum() == 8          # both trees' 4 nodes
    assert p.requests["a"].rated is None                               # counted once
    # rows dearer than the (calibrated) nodes are worth: nothing drafted, a plain step follows
    p.budget.gain.measured_costs = lambda: GainCosts(row=1.0, request=0.0, greedy_request=0.0)
    assert p.propose_step(runner, _sched(), [[3]] * 2) == [[], []]
    assert "a" not in p.requests.trees and p.requests["a"].rated is None
    # rows at half of what the first nodes are worth: a prefix is kept
    p.budget.gain.measured_costs = lambda: GainCosts(row=0.2, request=0.0, greedy_request=0.0)
    drafts = p.propose_step(runner, _sched(), [[3]] * 2)
    assert all(0 < len(d) <= 4 for d in drafts) and drafts[0] == [9, 1, 2, 3][:len(drafts[0])]


def test_confidence_mode_calibrates_the_score_it_decides_by_unless_told_to_calibrate_the_rating(monkeypatch):
    """budget.gain.calibrate_score (default true): what verification calibrates is each node's
    score, the larger of the drafter's rating and the request's own reach; false keeps the
    earlier rule, the rating itself. (Prompt lookup rates a lone match 1.0; its ratings are
    replaced by 0.3 so that a new request's prior reach is the larger.)"""
    from vllm import SamplingParams

    import vllm_treespec.engine.budget_control as budget_control
    from vllm_treespec.budget.confidence import batch_path_probs
    from vllm_treespec.engine.proposer import TreeProposer

    def low_ratings(trees):
        probs, offsets = batch_path_probs(trees)
        return np.full_like(probs, 0.3), offsets

    monkeypatch.setattr(budget_control, "batch_path_probs", low_ratings)

    rated = {}
    for calibrate_score in (True, False):
        p = TreeProposer(_vllm_config(k=4, treespec={"drafter": {"type": "prompt_lookup"}, "budget": {"gain": {
            "enabled": True, "confidence": True, "calibrate_score": calibrate_score}}}))
        runner = _runner([[1, 2, 3, 9, 1, 2, 3]], ["a"])
        runner.requests = {"a": SimpleNamespace(sampling_params=SamplingParams(temperature=0.0), output_token_ids=[1])}
        assert len(p.propose_step(runner, _sched(), [[3]])[0]) > 0
        rated[calibrate_score] = p.requests["a"].rated[0]
        record = p.requests["a"].gain_record(p.budget.gain)
    ratings = rated[False]
    own = p.budget.gain.reach.reach_many([record.acceptance])[0, :ratings.size]
    assert np.allclose(ratings, 0.3) and np.allclose(rated[True], np.maximum(ratings, own))
    assert np.any(rated[True] > ratings)          # a new request's prior reach lifts some nodes


def test_confidence_mode_rates_the_greedy_trees_of_a_drafter_that_samples(tmp_path):
    """A draft model with draft_sampling: sample draws only sampled requests' trees from its q;
    greedy requests get its top-k trees, which confidence mode rates and cuts like any other."""
    from vllm import SamplingParams
    from treespec_fixtures.qwen3 import Qwen3Shape, new_model

    from vllm_treespec.engine.proposer import TreeProposer

    shape = Qwen3Shape(vocab_size=61, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                       head_dim=16, intermediate_size=32, max_position_embeddings=128)
    new_model(shape, eos_token_id=0, seed=5, init_std=0.3).save_pretrained(str(tmp_path), safe_serialization=True)
    cfg = _vllm_config(k=4, treespec={
        "drafter": {"type": "draft_model", "path": str(tmp_path), "draft_sampling": "sample"},
        "tree": {"builder": "chain"}, "budget": {"gain": {"enabled": True, "confidence": True}}})
    cfg.model_config.get_vocab_size = lambda: 61
    cfg.model_config.skip_tokenizer_init = False
    p = TreeProposer(cfg)
    assert p.drafter.capabilities.samples_drafts
    ids = ["greedy", "sampled"]
    runner = _runner([[1, 2, 3, 9, 1, 2, 3]] * 2, ids)
    runner.requests = {r: SimpleNamespace(sampling_params=SamplingParams(temperature=t), output_token_ids=[1])
                       for r, t in zip(ids, (0.0, 0.8))}
    drafts = p.propose_step(runner, _sched(), [[3]] * 2)
    assert len(drafts[0]) == 4 and len(drafts[1]) == 4          # rows are free before any cost is measured
    assert p.requests["greedy"].rated[0].shape == (4,) and p.requests["greedy"].draft_probs is None
    assert p.requests["sampled"].rated is None and p.requests["sampled"].draft_probs is not None


def test_confidence_mode_leaves_sampled_requests_on_their_own_history():
    """Sampled requests keep the history rule: drafting each of them every step to rate its draft
    measured as losing (docs/never-slower.md), and a seeded one's trees must not depend on
    other traffic."""
    from vllm import SamplingParams

    from vllm_treespec.engine.proposer import TreeProposer

    p = TreeProposer(_vllm_config(k=4, treespec={"drafter": {"type": "prompt_lookup"},
                                                 "budget": {"gain": {"enabled": True, "confidence": True}}}))
    ids = ["seeded", "unseeded"]
    runner = _runner([[1, 2, 3, 9, 1, 2, 3]] * 2, ids)
    runner.requests = {r: SimpleNamespace(sampling_params=SamplingParams(temperature=0.8, seed=seed),
                                          output_token_ids=[1]) for r, seed in zip(ids, (3, None))}
    assert p.propose_step(runner, _sched(), [[3]] * 2) == [[9, 1, 2, 3]] * 2     # optimistic / class prior
    assert all(p.requests[r].rated is None and p.requests[r].gain.waited is None for r in ids)
    assert p.requests["seeded"].seeded_sampled and p.requests["unseeded"].gain_class == "T0.8"


def test_a_stopped_request_waits_without_its_per_step_checks(monkeypatch):
    """A request that budget.gain stopped and that waits for its probe is settled first: its
    blocker, room and reach are not looked up that step (most of a sampled batch waits), and
    its wait is counted once."""
    from vllm import SamplingParams

    from vllm_treespec.engine.proposer import TreeProposer
    from vllm_treespec.engine.request_table import RequestTable

    p = TreeProposer(_vllm_config(k=4, treespec={"drafter": {"type": "prompt_lookup"},
                                                 "budget": {"gain": {"enabled": True}}}))
    runner = _runner([[1, 2, 3, 9, 1, 2, 3]], ["s"])
    runner.requests = {"s": SimpleNamespace(sampling_params=SamplingParams(temperature=0.8), output_token_ids=[1])}
    p.propose_step(runner, _sched(), [[3]])                       # first decision: its state is made
    record = p.requests["s"].gain
    record.waited, record.interval, record.probed = 0, 64, False  # stopped, its probe far away
    looked_up = []
    blocker = RequestTable.blocker
    monkeypatch.setattr(RequestTable, "blocker", lambda self, r, rn: looked_up.append(r) or blocker(self, r, rn))
    assert p.propose_step(runner, _sched(), [[3]]) == [[]]
    assert looked_up == [] and record.waited == 1
    record.waited, record.interval = None, None                   # not stopped: checked as before
    p.budget.end_quiet(p.requests)      # (changed by hand: forget the quiet stretch planned on it)
    p.propose_step(runner, _sched(), [[3]])
    assert looked_up == ["s"]


def _decode_sched(ids: list[str], drafts: list[list[int]]) -> SimpleNamespace:
    """A decode step's scheduler output: one row per request plus its scheduled drafts."""
    return SimpleNamespace(num_spec_tokens_to_schedule=0, finished_req_ids=set(),
                           num_scheduled_tokens={r: 1 + len(d) for r, d in zip(ids, drafts)},
                           scheduled_spec_decode_tokens={r: d for r, d in zip(ids, drafts) if d},
                           total_num_scheduled_tokens=sum(1 + len(d) for d in drafts))


def _runner_step(p, runner, sched, sampled: list[list[int]]) -> list[list[int]]:
    """A step's proposer calls as the runner patches make them: `_prepare_inputs` marks a step
    without scheduled drafts plain; `sample_tokens` takes a quiet stretch's step by
    `take_quiet_step` alone, any other by `propose_step`."""
    p.plain_step = not sched.scheduled_spec_decode_tokens
    if p.takes_quiet_step(runner, sched):
        p.take_quiet_step(sampled)
        return [[] for _ in sampled]
    return p.propose_step(runner, sched, sampled)


def _quiet_run(quiet: bool, steps: int, seeds: tuple, monkeypatch, paused: range = range(0),
               timed: bool = False, guard_by_hand: bool = True) -> tuple:
    """A proposer over a fixed batch of sampled requests whose drafts never pay (so budget.gain
    stops them and they only wait for probes), `steps` steps, with or without quiet stretches,
    the guard pausing drafting in the steps of `paused` (`guard_by_hand` False: as its own
    schedule and measurements decide); `timed`: each step is timed, scheduled and called as the
    runner would (so budget.gain and the guard observe it, `_runner_step`). Returns each
    step's drafts, the records' gain state, the statistics and the proposer."""
    from vllm import SamplingParams

    from vllm_treespec.budget.gain import GainCosts
    from vllm_treespec.engine.budget_control import BudgetControl
    from vllm_treespec.engine.proposer import TreeProposer

    if not quiet:
        monkeypatch.setattr(BudgetControl, "_quiet_stretch", lambda self, *a: None)
    if timed:
        # these steps take microseconds, so the gap between them would read as idle
        # (`_guard_period`): every period is counted here, as between served steps
        from vllm_treespec.engine import budget_control

        monkeypatch.setattr(budget_control, "_guard_period",
                            lambda now, last, seconds: None if last is None else now - last)
    p = TreeProposer(_vllm_config(k=4, max_model_len=512, treespec={
        "drafter": {"type": "prompt_lookup"},
        "budget": {"gain": {"enabled": True, "probe_every": 4, "max_probe_every": 16, "calibrate_every": 8,
                            "fixed_row_cost": 1.0, "fixed_request_cost": 64.0}}}))
    p.budget.gain.measured_costs = lambda: GainCosts(row=10.0, request=10.0, greedy_request=10.0)
    ids = [f"r{i}" for i in range(len(seeds))]
    text = [5, 6, 7, 8] * 3                  # a probe drafts, and its shadow never settles whole
    runner = _runner([text] * len(ids), ids, width=512)
    runner.requests = {r: SimpleNamespace(sampling_params=SamplingParams(temperature=0.8, seed=seed),
                                          output_token_ids=[1], num_prompt_tokens=4)
                       for r, seed in zip(ids, seeds)}
    drafts = []
    for step in range(steps):
        if guard_by_hand:
            p.budget.guard.allows = step not in paused     # (the guard's verdict, set by hand)
        sched = _sched()
        if timed:
            p.step_started_at = time.perf_counter()
            sched = _decode_sched(ids, drafts[-1] if drafts else [[]] * len(ids))
        drafts.append(_runner_step(p, runner, sched, [[1]] * len(ids)) if timed
                      else p.propose_step(runner, sched, [[1]] * len(ids)))
        runner.input_batch.num_tokens_no_spec[:len(ids)] += 1      # each sampled one token
        runner.input_batch.token_ids_cpu[:len(ids), len(text) + step] = 1
    p.on_requests_finished(["r0"])           # ends a stretch: its counts are made then
    state = [(r.waited, r.interval, r.held_for, r.probing, r.probed)
             for r in (p.requests[i].gain for i in ids[1:])]
    s = p.stats
    stats = (s.gain_decisions, s.step_kinds, s.budget_choices, s.draft_steps, s.budget_count,
             p.budget.gain._step, [p.requests[i].steps for i in ids[1:]], s.steps, p.budget.gain.cost.steps)
    return drafts, state, stats, p


@pytest.mark.parametrize("seeds", [(None,), (None, None, None), (None, 7)])
def test_quiet_stretches_decide_and_count_as_every_step_would(seeds, monkeypatch):
    """Steps in which budget.gain knows no request can draft are skipped and decided in one go
    at the stretch's end (engine/budget_control.py): the drafts, each request's gain state and
    every count come out as when each step is decided as it comes."""
    with monkeypatch.context() as m:
        plain = _quiet_run(False, 80, seeds, m)
    quiet = _quiet_run(True, 80, seeds, monkeypatch)
    assert quiet[:3] == plain[:3]
    stats = quiet[2]
    assert stats[0].get("stopped", 0) > 40 and stats[1].get("calibration", 0) >= 9


@pytest.mark.parametrize("seeds", [(None, None), (None, 7)])
def test_steps_the_guard_pauses_are_quiet_and_count_as_every_step_would(seeds, monkeypatch):
    """While budget.gain.guard pauses drafting, nobody but seeded sampled requests can draft:
    those steps are a quiet stretch too, ended when the guard's verdict changes (here from
    step 10 to 49, then again from step 60, in the middle of stretches), and everything comes
    out as when each step is decided as it comes: the paused requests are not decided, the
    seeded one is, and the steps count as paused."""
    from vllm_treespec.engine.budget_control import BudgetControl

    paused = [*range(10, 50), *range(60, 80)]
    with monkeypatch.context() as m:
        plain = _quiet_run(False, 80, seeds, m, paused=paused)
    calls = []
    caps = BudgetControl.caps
    monkeypatch.setattr(BudgetControl, "caps", lambda self, *a: calls.append(1) or caps(self, *a))
    quiet = _quiet_run(True, 80, seeds, monkeypatch, paused=paused)
    assert quiet[:3] == plain[:3]
    assert quiet[2][1].get("paused", 0) + quiet[2][1].get("calibration", 0) >= 55
    if seeds == (None, None):
        assert len(calls) <= 30          # of 80 steps, 60 of them paused


@pytest.mark.parametrize("seeds", [(None, None), (None, 7)])
def test_timed_quiet_steps_observe_decide_and_count_as_every_step_would(seeds, monkeypatch):
    """Served, a quiet stretch's step is one call (TreeProposer.take_quiet_step, vLLM sampling
    it as a plain step): the step's cost for budget.gain, its period for the guard and its
    worker-step time are kept and observed when the stretch ends. Everything comes out as when
    each step is observed and decided as it comes, the cost observations and the guard's steps
    in the same order, through guard verdicts that change in the middle of stretches."""
    from vllm_treespec.budget.gain import GainControl
    from vllm_treespec.budget.guard import SpeculationGuard
    from vllm_treespec.engine.proposer import TreeProposer

    paused = [*range(10, 50), *range(60, 80)]

    def run(quiet, m):
        seen, guard_seen, quiet_steps = [], [], []
        observe = GainControl.observe_step
        m.setattr(GainControl, "observe_step",
                  lambda self, sec, n, rows, emitted, *a, **k: seen.append((n, rows, emitted))
                  or observe(self, sec, n, rows, emitted, *a, **k))
        plain_steps = GainControl.observe_plain_steps
        m.setattr(GainControl, "observe_plain_steps",
                  lambda self, secs, n: seen.extend([(n, 0, n)] * len(secs)) or plain_steps(self, secs, n))
        step = SpeculationGuard.step
        m.setattr(SpeculationGuard, "step", lambda self, sec, tokens, n: guard_seen.append(
            (sec is None, tokens, n, self._hold_left)) or step(self, sec, tokens, n))
        steady = SpeculationGuard.steady

        def steady_steps(self, secs, tokens, n):      # as `step` would have seen each of them
            testing = self._test_step >= 0
            guard_seen.extend((sec is None, tokens, n, self._hold_left - (0 if testing else i))
                              for i, sec in enumerate(secs))
            return steady(self, secs, tokens, n)

        m.setattr(SpeculationGuard, "steady", steady_steps)
        take = TreeProposer.take_quiet_step
        m.setattr(TreeProposer, "take_quiet_step", lambda self, s: quiet_steps.append(1) or take(self, s))
        return _quiet_run(quiet, 80, seeds, m, paused=paused, timed=True), seen, guard_seen, quiet_steps

    with monkeypatch.context() as m:
        (plain, plain_seen, plain_guard, _) = run(False, m)
    quiet, seen, guard_seen, quiet_steps = run(True, monkeypatch)
    assert quiet[:3] == plain[:3] and seen == plain_seen and guard_seen == plain_guard
    assert len(seen) == 80 and quiet[2][-2] == 80                   # every step observed once
    assert len(guard_seen) == 80
    assert len(quiet_steps) >= (40 if seeds == (None, None) else 1)  # (a seeded request's verified
    #                                                                   probes break more stretches)


@pytest.mark.parametrize("seeds", [(None, None), (None, 7)])
def test_quiet_stretches_end_where_the_guard_could_change_its_verdict(seeds, monkeypatch):
    """The guard's own schedule (a test every `hold` steps, windows of `window` steps inside it)
    changes its verdict at steps a quiet stretch does not see, since its steps are fed to the
    guard only at the stretch's end: stretches end there (SpeculationGuard.steady_steps), and
    everything, the guard's tests and verdicts included, comes out as step by step."""
    from vllm_treespec.budget import guard as guard_module
    from vllm_treespec.budget.guard import SpeculationGuard
    from vllm_treespec.engine.budget_control import BudgetControl

    # verdicts that do not depend on this machine's step times: every test allows drafting
    # (its windows still pause it), and none holds longer for a clear gain
    init = SpeculationGuard.__init__
    monkeypatch.setattr(SpeculationGuard, "__init__", lambda self, **k: init(
        self, window=4, hold=20, margin=0.99, first_test=12, min_steps=2))
    monkeypatch.setattr(guard_module, "CLEAR_GAIN", float("inf"))

    def run(quiet, m):
        verdicts = []
        finish = SpeculationGuard._finish_test
        m.setattr(SpeculationGuard, "_finish_test", lambda self: finish(self) or verdicts.append(
            (self.tests, self.allows, self._hold_left)))
        return _quiet_run(quiet, 120, seeds, m, timed=True, guard_by_hand=False), verdicts

    with monkeypatch.context() as m:
        plain, plain_verdicts = run(False, m)
    calls = []
    caps = BudgetControl.caps
    monkeypatch.setattr(BudgetControl, "caps", lambda self, *a: calls.append(1) or caps(self, *a))
    quiet, verdicts = run(True, monkeypatch)
    assert quiet[:3] == plain[:3] and verdicts == plain_verdicts and len(verdicts) == 2
    guard = quiet[3].budget.guard
    assert guard.tests == len(verdicts)
    if seeds == (None, None):
        assert len(calls) < 100          # of 120 steps: quiet stretches between the guard's changes


def test_a_quiet_step_in_which_a_request_sampled_nothing_ends_the_stretch(monkeypatch):
    """`take_quiet_step` checks after sampling that every request sampled a token (a stretch's
    batch only decodes, so this cannot fail served, but a step that fails it must not count as
    a quiet one): the stretch ends there, its steps so far counted, this one unobserved."""
    drafts, state, stats, p = _quiet_run(True, 12, (None, None), monkeypatch, timed=True)
    ids = ["r1"]
    runner = _runner([[5, 6, 7, 8] * 3], ids, width=512)
    for _ in range(40):                     # until a stretch runs and has taken a step
        sched = _decode_sched(ids, [[]])
        p.step_started_at = time.perf_counter()
        _runner_step(p, runner, sched, [[1]])
        if p.budget._quiet is not None and p.budget._quiet.done:
            break
    quiet = p.budget._quiet
    assert quiet is not None and quiet.done and quiet.steps > 0
    observed, kept, done = p.stats.steps, len(quiet.observed), quiet.done
    counted = p.requests["r1"].steps
    p.step_started_at = time.perf_counter()
    p.plain_step = True
    assert p.takes_quiet_step(runner, _decode_sched(ids, [[]]))
    p.take_quiet_step([[]])
    assert p.budget._quiet is None and p.stats.steps == observed + kept      # this step unobserved
    assert p.requests["r1"].steps == counted + done          # the stretch's steps counted, not this one


def test_kept_quiet_observations_come_before_the_next_steps_own(monkeypatch):
    """The costs `take_quiet_step` kept are observed before any later step's (`observe_step`
    replays them first), in the order their steps ran, the guard's periods and the
    worker-step times with them."""
    from vllm_treespec.budget.gain import GainControl
    from vllm_treespec.budget.guard import SpeculationGuard
    from vllm_treespec.engine.budget_control import _QuietStretch
    from vllm_treespec.engine.proposer import TreeProposer

    p = TreeProposer(_vllm_config(k=4, treespec={"drafter": {"type": "prompt_lookup"},
                                                 "budget": {"gain": {"enabled": True}}}))
    seen, times, guard_seen = [], [], []
    observe = GainControl.observe_step
    monkeypatch.setattr(GainControl, "observe_step",
                        lambda self, sec, *a, **k: seen.append(round(sec, 6)) or observe(self, sec, *a, **k))
    step = SpeculationGuard.step
    monkeypatch.setattr(SpeculationGuard, "step",
                        lambda self, sec, *a: guard_seen.append(sec if sec is None else round(sec, 6))
                        or step(self, sec, *a))
    plain_steps = GainControl.observe_plain_steps
    monkeypatch.setattr(GainControl, "observe_plain_steps",
                        lambda self, secs, n: seen.extend(round(s, 6) for s in secs) or plain_steps(self, secs, n))
    steady = SpeculationGuard.steady
    monkeypatch.setattr(SpeculationGuard, "steady", lambda self, secs, *a: guard_seen.extend(
        s if s is None else round(s, 6) for s in secs) or steady(self, secs, *a))
    p.stats.observe_step = times.append
    p.stats.observe_steps = times.extend
    p.budget._quiet = _QuietStretch(["a"], [], [], steps=5, chosen=4, allows=True,
                                    observed=[(0.001, None, 0.002), (0.003, 0.005, 0.004)])
    p.budget.observe_step(_decode_sched(["a"], [[]]), time.perf_counter() - 0.5)
    assert seen[:2] == [0.001, 0.003] and len(seen) == 3 and times == [0.002, 0.004]
    assert guard_seen[:2] == [None, 0.005] and len(guard_seen) == 3
    assert p.budget._quiet.observed == []


def test_the_guard_counts_no_period_that_spans_an_idle_gap(monkeypatch):
    """A step after an idle gap (no request for a while) would charge the gap to one side of a
    guard test: its period is not counted (None), in full steps and in a stretch's kept steps
    alike; a step's ordinary period is."""
    from vllm_treespec.budget.guard import SpeculationGuard
    from vllm_treespec.engine import budget_control
    from vllm_treespec.engine.budget_control import _QuietStretch
    from vllm_treespec.engine.proposer import TreeProposer

    assert budget_control._guard_period(10.0, None, 0.002) is None
    assert budget_control._guard_period(10.0, 9.997, 0.002) == pytest.approx(0.003)
    assert budget_control._guard_period(10.0, 9.5, 0.002) is None            # a 0.5 s gap
    p = TreeProposer(_vllm_config(k=4, treespec={"drafter": {"type": "prompt_lookup"},
                                                 "budget": {"gain": {"enabled": True}}}))
    seen = []
    step = SpeculationGuard.step
    monkeypatch.setattr(SpeculationGuard, "step", lambda self, sec, *a: seen.append(sec) or step(self, sec, *a))
    sched = _decode_sched(["a"], [[]])
    p.budget.observe_step(sched, time.perf_counter() - 0.002)                 # no step before it
    p.budget.observe_step(sched, time.perf_counter() - 0.002)                 # right after the last
    p.budget._last_step_at -= 1.0                                             # then an idle second
    p.budget.observe_step(sched, time.perf_counter() - 0.002)
    assert seen[0] is None and seen[1] is not None and seen[1] < 0.5 and seen[2] is None
    p.budget._quiet = _QuietStretch(["a"], [], [], steps=5, chosen=4, allows=True)
    p.budget._last_step_at -= 1.0
    p.budget.take_quiet_step(time.perf_counter() - 0.002)
    p.budget.take_quiet_step(time.perf_counter() - 0.002)
    assert p.budget._quiet.observed[0][1] is None and p.budget._quiet.observed[1][1] is not None


def test_quiet_stretches_skip_the_per_step_work(monkeypatch):
    """The point of a stretch: in most sampled steps the proposer does not call the budget's
    per-step decisions at all."""
    from vllm_treespec.engine.budget_control import BudgetControl

    calls = []
    caps = BudgetControl.caps
    monkeypatch.setattr(BudgetControl, "caps", lambda self, *a: calls.append(1) or caps(self, *a))
    _quiet_run(True, 80, (None, None), monkeypatch)
    assert len(calls) <= 50          # of 80 steps (probes every 4 to 16 steps, calibration every 8)


def test_an_unseeded_request_whose_draft_the_step_held_sits_out_the_next_steps(monkeypatch):
    """A held draft (it pays for its own rows, not for the speculative step) leaves an unseeded
    sampled request's acceptance unchanged, so it is not decided again at once: for the next
    probe_every steps it sits out without its per-step checks (counted `held`), then decides
    in full again. A greedy request held the same way decides again next step."""
    from vllm import SamplingParams

    from vllm_treespec.budget.gain import GainCosts
    from vllm_treespec.engine.proposer import TreeProposer
    from vllm_treespec.engine.request_table import RequestTable

    p = TreeProposer(_vllm_config(k=4, treespec={"drafter": {"type": "prompt_lookup"},
                                                 "budget": {"gain": {"enabled": True, "probe_every": 4}}}))
    gain = p.budget.gain
    gain.measured_costs = lambda: GainCosts(row=0.0, request=0.0, greedy_request=0.0)
    gain.step_cost = lambda: 1e9                   # no draft can pay for a speculative step
    ids = ["sampled", "greedy"]
    runner = _runner([[1, 2, 3, 9, 1, 2, 3]] * 2, ids)
    runner.requests = {r: SimpleNamespace(sampling_params=SamplingParams(temperature=t), output_token_ids=[1])
                       for r, t in zip(ids, (0.7, 0.0))}
    looked_up = []
    blocker = RequestTable.blocker
    monkeypatch.setattr(RequestTable, "blocker", lambda self, r, rn: looked_up.append(r) or blocker(self, r, rn))
    assert p.propose_step(runner, _sched(), [[3]] * 2) == [[], []]      # both held
    assert looked_up == ids and p.requests["sampled"].gain.held_for == 4
    assert p.stats.gain_decisions["held"] == 2
    assert p.stats.step_kinds == {"held": 1}                         # the step went plain, held
    for step in range(4):                                                # the sampled one sits out
        looked_up.clear()
        assert p.propose_step(runner, _sched(), [[3]] * 2) == [[], []]
        assert looked_up == ["greedy"]
    assert p.stats.gain_decisions["held"] == 2 + 4 * 2
    looked_up.clear()
    p.propose_step(runner, _sched(), [[3]] * 2)                          # then decides again
    assert looked_up == ids and p.requests["sampled"].gain.held_for == 4


@pytest.mark.parametrize("reach_floor", [0.0, 0.3])
def test_an_unseeded_probe_is_settled_by_the_tokens_sampled_next_not_verified(reach_floor):
    """budget.gain's probe of an unseeded sampled request is drafted but not sent (the step stays
    plain); the tokens the request samples in the next steps settle it as a verified tree would
    be (budget/shadow.py), budget.reach_floor learning from it too. A seeded request's probe is
    verified as before: its decisions rest on its own verified history."""
    from vllm import SamplingParams

    from vllm_treespec.budget.gain import GainCosts
    from vllm_treespec.engine.proposer import TreeProposer

    p = TreeProposer(_vllm_config(k=4, treespec={"drafter": {"type": "prompt_lookup"}, "budget": {"gain": {
        "enabled": True, "probe_every": 2, "max_probe_every": 2, "fixed_row_cost": 1.0,
        "fixed_request_cost": 64.0}, "reach_floor": reach_floor}}))
    p.budget.gain.measured_costs = lambda: GainCosts(row=10.0, request=10.0, greedy_request=10.0)
    ids = ["unseeded", "seeded"]
    text = [1, 2, 3, 9, 1, 2, 3]

    def step(rows):
        runner = _runner(rows, ids)
        runner.requests = {r: SimpleNamespace(sampling_params=SamplingParams(temperature=0.8, seed=seed),
                                              output_token_ids=[1]) for r, seed in zip(ids, (None, 3))}
        return p.propose_step(runner, _sched(), [[3]] * 2)

    assert step([text] * 2) == [[], []]                    # nothing pays; no probe due yet
    assert p.stats.step_kinds == {"no drafts": 1}
    assert step([text] * 2) == [[], [9, 1]]                # both probe: the seeded one is sent
    shadow = p.requests["unseeded"].shadow
    assert shadow is not None and shadow.tree.draft_token_ids() == [9, 1] and shadow.start == len(text)
    assert p.stats.gain_decisions["probe"] == 2
    step([text + [9], text])                               # node 9 has a child: not settled yet
    assert p.requests["unseeded"].shadow is shadow and p.stats.shadow_probes == 0
    step([text + [9, 1], text])                            # the whole chain, to its leaf
    assert (p.stats.shadow_probes, p.stats.shadow_accepted) == (1, 2)
    # speculative only in the seeded request's probe steps (2 and 4), never for the shadow probes
    assert p.stats.step_kinds == {"no drafts": 2, "speculative": 2}
    assert p.requests["unseeded"].gain.acceptance is not None
    if reach_floor:                                        # one 2-deep tree, accepted whole
        assert p.requests["unseeded"].reach.accepted[:2].tolist() == [1.0, 1.0]
    else:
        assert p.requests["unseeded"].reach is None


def test_drafters_with_q_or_target_states_keep_verified_probes():
    """Shadow probes measure the target-only rule; drafts verified against their drafter's q, or
    drafted from the target's states, keep verified probes."""
    from vllm_treespec.drafters.base import DrafterCapabilities
    from vllm_treespec.engine.proposer import TreeProposer

    cfg = _vllm_config(k=4, treespec={"drafter": {"type": "prompt_lookup"}, "budget": {"gain": {"enabled": True}}})
    assert TreeProposer(cfg).budget.gain.shadow_probes
    for caps in (DrafterCapabilities(samples_drafts=True), DrafterCapabilities(uses_target_states=True)):
        budget = TreeProposer(cfg).budget
        budget.use_drafter(caps)
        assert not budget.gain.shadow_probes
    off = _vllm_config(k=4, treespec={"drafter": {"type": "prompt_lookup"},
                                      "budget": {"gain": {"enabled": True, "shadow_probes": False}}})
    assert not TreeProposer(off).budget.gain.shadow_probes


def test_only_tree_deployments_replace_the_attention_backend(monkeypatch):
    """A chain deployment leaves vLLM's attention backend alone (the tree wrapper would cost a
    call per layer and step for nothing); one that drafts branching trees registers the tree
    backend before the model is built. A branching tree that reaches a chain deployment's
    verification anyway is refused, not verified on the causal kernel."""
    import vllm_treespec.engine as engine
    from vllm_treespec.engine import tree_attention_backend
    from vllm_treespec.engine.proposer import TreeProposer
    from vllm_treespec.tree import DraftTree

    registered = []
    monkeypatch.setattr(engine, "_tree_attention", False)
    monkeypatch.setattr(tree_attention_backend, "register", lambda: registered.append(1))
    chain = TreeProposer(_vllm_config(k=4, treespec="prompt-lookup"))
    assert chain.config.tree.builder == "chain" and registered == []
    TreeProposer(_vllm_config(k=4, treespec="prompt-lookup-tree"))
    assert registered == [1]
    TreeProposer(_vllm_config(k=4, treespec="prompt-lookup-tree"))     # once per process
    assert registered == [1]

    chain.requests.state("a").tree = DraftTree([7, 4, 5, 6], [-1, 0, 0, 2])   # branching
    with pytest.raises(RuntimeError, match="branching tree under tree.builder chain"):
        chain.plan_step(["a"], np.array([4]), {"a": [4, 5, 6]}, np.array([0, 4]), np.array([10]))
    chain.requests.state("a").tree = DraftTree.chain(7, [4, 5])
    assert chain.plan_step(["a"], np.array([3]), {"a": [4, 5]}, np.array([0, 3]), np.array([10])).attn is None


def test_rated_trees_calibrate_in_one_update_as_tree_by_tree():
    """The step's rated trees update the calibration at once; the counts are those of one update
    per tree (nodes past what vLLM scheduled, and accepted ids past them, are left out), each
    node in its source's curve."""
    from vllm_treespec.budget.confidence import GREEDY_CLASS, DraftCalibration
    from vllm_treespec.engine.proposer import TreeProposer

    p = TreeProposer(_vllm_config(k=4, treespec={"drafter": {"type": "prompt_lookup"},
                                                 "budget": {"gain": {"enabled": True, "confidence": True}}}))
    rated = {"a": np.array([0.9, 0.7, 0.4]), "b": None, "c": np.array([0.95, 0.05]), "d": np.array([0.3])}
    sources = {"a": np.array([0, 1, 1], np.int8), "c": np.array([1, 0], np.int8), "d": np.array([0], np.int8)}
    for req_id, probs in rated.items():
        p.requests.state(req_id).rated = None if probs is None else (probs, sources[req_id])
    sizes = [3, 2, 1, 1]                                   # vLLM scheduled one node of c's two
    accepted_nodes = np.array([[1, 2, -1], [1, -1, -1], [1, 2, -1], [-1, -1, -1]])
    p.budget._observe_rated(p.requests, list(rated), sizes, accepted_nodes)
    reference = DraftCalibration()
    reference.observe(GREEDY_CLASS, rated["a"], np.array([True, True, False]), sources["a"])
    reference.observe(GREEDY_CLASS, rated["c"][:1], np.array([True]), sources["c"][:1])
    reference.observe(GREEDY_CLASS, rated["d"], np.array([False]), sources["d"])
    for source in (0, 1):
        np.testing.assert_array_equal(p.budget.calibration.observed(GREEDY_CLASS, source),
                                      reference.observed(GREEDY_CLASS, source))
        np.testing.assert_allclose(p.budget.calibration.rates(GREEDY_CLASS, source),
                                   reference.rates(GREEDY_CLASS, source))
    assert p.budget.calibration.observed(GREEDY_CLASS, 1).sum() == 3     # a's last two, c's first
    assert all(p.requests[r].rated is None for r in rated)


def _shadow_probes_waiting():
    """A proposer with reach and gain rules and six requests whose 2-node shadow probes were
    drafted when each had 1 token: even requests' rows go on with the probe's first token (the
    walk needs the next), odd ones with another (settled at once)."""
    from vllm_treespec.budget.shadow import ShadowProbe
    from vllm_treespec.engine.proposer import TreeProposer
    from vllm_treespec.tree.draft_tree import DraftTree

    p = TreeProposer(_vllm_config(k=4, treespec={"preset": "prompt-lookup", "budget": {
        "reach_floor": 0.05, "gain": {"enabled": True}}}))
    ids = [f"r{i}" for i in range(6)]
    rows = [[7, 1, 2, 3, 4][:2 + i % 3] if i % 2 == 0 else [7, 5, 6][:2 + i % 2] for i in range(6)]
    for req_id in ids:
        st = p.requests.state(req_id)
        st.gain_record(p.budget.gain).waited = 0
        st.reach_record(p.budget.reach)
        st.shadow = ShadowProbe(DraftTree.chain(7, [1, 2]), 1)
        p.budget._shadows.add(req_id)
    return p, ids, _runner(rows, ids), [len(r) for r in rows]


def test_shadow_probes_settled_together_learn_as_one_by_one(monkeypatch):
    """Shadow probes that settle in one step (a class's probes are due on the same steps) are
    observed in one update, which leaves every request's reach and gain records as observing
    them one at a time would, and computes the pooled reach statistics once, not once per probe
    (at 32 clients that was a pass over every live request per probe)."""
    from vllm_treespec.engine.budget_control import BudgetControl

    reference, ids, runner, lengths = _shadow_probes_waiting()
    for i, req_id in enumerate(ids):                    # one at a time, as before
        st = reference.requests[req_id]
        settled = st.shadow.settle(runner.input_batch.token_ids_cpu[i, 1:lengths[i]].tolist())
        if settled is not None:
            reference.budget._observe_depths(reference.requests, [st], [settled[0]], [settled[1]])
    p, *_ = _shadow_probes_waiting()
    calls = []
    original = BudgetControl.reach_means
    monkeypatch.setattr(BudgetControl, "reach_means", lambda self, r: calls.append(1) or original(self, r))
    p.budget.settle_shadow_probes(p.requests, ids, runner.input_batch.token_ids_cpu, lengths)
    assert len(calls) == 1 and p.budget._shadows == {"r0"}      # r0 has only the first token
    for req_id in ids:
        got, want = p.requests[req_id], reference.requests[req_id]
        assert np.array_equal(got.reach.reached, want.reach.reached) and got.reach.cap == want.reach.cap
        assert np.array_equal(got.gain.acceptance.accepted, want.gain.acceptance.accepted)
        assert (got.gain.interval, got.gain.probed) == (want.gain.interval, want.gain.probed)


def _unbudgeted_run(quiet: bool, steps: int, budget: dict, monkeypatch) -> tuple:
    """A proposer without budget.gain over a fixed batch of two sampled requests (one seeded),
    `steps` steps called as the runner would (`_runner_step`), with or without quiet stretches.
    Returns each step's drafts, the statistics, the number of full steps and the proposer."""
    from vllm import SamplingParams

    from vllm_treespec.engine.budget_control import BudgetControl
    from vllm_treespec.engine.proposer import TreeProposer

    if not quiet:
        monkeypatch.setattr(BudgetControl, "_unbudgeted_stretch", lambda self, *a: None)
    full = []
    caps = BudgetControl.caps
    monkeypatch.setattr(BudgetControl, "caps", lambda self, *a: full.append(1) or caps(self, *a))
    p = TreeProposer(_vllm_config(k=4, max_model_len=512, treespec={"drafter": {"type": "prompt_lookup"},
                                                                    "budget": budget}))
    ids = ["r0", "r1"]
    text = [5, 6, 7, 8] * 3                  # prompt lookup would draft, given a node
    runner = _runner([text] * 2, ids, width=512)
    runner.requests = {r: SimpleNamespace(sampling_params=SamplingParams(temperature=0.8, seed=seed),
                                          output_token_ids=[1], num_prompt_tokens=4)
                       for r, seed in zip(ids, (None, 7))}
    drafts = []
    for step in range(steps):
        p.step_started_at = time.perf_counter()
        drafts.append(_runner_step(p, runner, _decode_sched(ids, [[], []]), [[1], [1]]))
        p.budget.observe_step(_decode_sched(ids, [[], []]), p.step_started_at)
        runner.input_batch.num_tokens_no_spec[:2] += 1
        runner.input_batch.token_ids_cpu[:2, len(text) + step] = 1
    p.on_requests_finished(["r0"])           # ends a stretch: its counts are made then
    s = p.stats
    stats = (s.step_kinds, s.budget_choices, s.draft_steps, s.budget_count, s.steps,
             p.requests["r1"].steps, p.requests["r1"].budget_given)
    return drafts, stats, len(full), p


ZERO_TABLE = {"mode": "table", "table": [{"batch": [1, None], "nodes": 0}]}


@pytest.mark.parametrize("budget", [ZERO_TABLE, {"mode": "table", "table": [
    {"batch": [1, 1], "nodes": 4}, {"batch": [2, None], "nodes": 0}]}])
def test_a_zero_budget_without_gain_runs_quiet_stretches_that_count_as_every_step_would(budget, monkeypatch):
    """Drafting configured off (a table's 0 nodes at the batch's size, no budget.gain): the
    proposer skips its per-step work in a quiet stretch, vLLM samples those steps as plain
    steps, and the drafts and every count come out as when each step runs in full."""
    with monkeypatch.context() as m:
        plain = _unbudgeted_run(False, 300, budget, m)
    quiet = _unbudgeted_run(True, 300, budget, monkeypatch)
    assert quiet[:2] == plain[:2]
    assert all(d == [[], []] for d in quiet[0])
    assert plain[2] == 300 and quiet[2] <= 3          # stretches of up to 256 steps
    assert quiet[1][0] == {"no drafts": 300} and quiet[1][1] == {0: 300}
    assert quiet[3].stats.plain_quiet_steps >= 290


@pytest.mark.parametrize("budget", [
    {"mode": "table", "table": [{"batch": [1, None], "context": [0, 100], "nodes": 0},
                                {"batch": [1, None], "context": [101, None], "nodes": 4}]},
    {"mode": "table", "table": [{"batch": [1, None], "nodes": 4}]}])
def test_no_quiet_stretch_without_gain_where_the_budget_may_draft(budget, monkeypatch):
    """A table that reads the context length may give nodes again as requests grow, and a
    budget above 0 drafts: every step runs in full."""
    run = _unbudgeted_run(True, 40, budget, monkeypatch)
    assert run[2] == 40 and run[3].stats.plain_quiet_steps == 0
