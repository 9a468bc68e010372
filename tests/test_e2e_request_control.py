"""Per-request control through `extra_args` ({"treespec_max_nodes": N}) and budget.gain,
through a real vLLM engine (offline `LLM`, CPU, fp32): greedy outputs stay equal to speculation
off whether a request opts out, caps its nodes, or shares steps with requests that draft; an
opted-out request drafts nothing; a cap bounds every tree; a step in which nobody drafts is a
plain step (engine/runner_patches.py) and still emits the same tokens."""
from __future__ import annotations

import pytest

from e2e import assert_same_outputs, greedy, run_engine, spec_config
from vllm_treespec.train import corpus

pytestmark = pytest.mark.e2e

K = 8
ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=1024, max_num_seqs=8, seed=0)
# These tests read what was drafted, so budget.gain.guard is off: on this tiny random model
# drafted steps may measure slower than paused ones, and the guard would pause drafting for
# timing reasons (budget/guard.py; tests/test_budget_guard.py covers it)
NO_GUARD = {"budget": {"gain": {"guard": False}}}
SPEC = dict(speculative_config=spec_config(K), additional_config={"treespec": {"preset": "prompt-lookup", **NO_GUARD}})
# the default preset (budget.gain.confidence: greedy drafts cut by their calibrated ratings) with
# branching trees, so rated trees that are not chains are cut and verified too
CONFIDENCE = dict(speculative_config=spec_config(K),
                  additional_config={"treespec": {"preset": "lookup-online", **NO_GUARD,
                                                  "tree": {"builder": "best_first", "max_depth": 8}}})
PROMPTS = corpus.held_out_prompts(16, prompt_chars=400, seed=11)


def _opt(max_nodes: int | None) -> dict:
    return {} if max_nodes is None else {"extra_args": {"treespec_max_nodes": max_nodes}}


def _phases(caps: list[int | None]) -> list[dict]:
    sampling = [greedy(48, **_opt(caps[i % len(caps)])) for i in range(len(PROMPTS))]
    return [{"name": "concurrency-1", "concurrency": 1, "prompts": PROMPTS, "sampling": sampling},
            {"name": "concurrency-8", "concurrency": 8, "prompts": PROMPTS, "sampling": sampling}]


@pytest.fixture(scope="module")
def runs(tiny_model):
    mixed = [0, 2, None]          # opted out, capped at 2, the deployment's budget
    return {
        "off": run_engine(tiny_model, ENGINE, _phases(mixed)),
        "mixed": run_engine(tiny_model, {**ENGINE, **SPEC}, _phases(mixed), inspect_proposer=True),
        "opted_out": run_engine(tiny_model, {**ENGINE, **SPEC}, _phases([0]), inspect_proposer=True),
        "capped": run_engine(tiny_model, {**ENGINE, **SPEC}, _phases([2]), inspect_proposer=True),
        "confidence": run_engine(tiny_model, {**ENGINE, **CONFIDENCE}, _phases(mixed), inspect_proposer=True),
    }


@pytest.mark.parametrize("run", ["mixed", "opted_out", "capped", "confidence"])
def test_greedy_outputs_equal_speculation_off(runs, run):
    assert_same_outputs(runs["off"], runs[run])


def test_opted_out_requests_draft_nothing_and_run_plain_steps(runs):
    state = runs["opted_out"]["proposer"][0]
    assert runs["opted_out"]["metrics"].get("vllm:spec_decode_num_drafts", 0) == 0
    assert state["stats"]["verified_trees"] == 0 and state["stats"]["verify_steps"] == 0
    assert state["stats"]["draft_steps"] > 0            # the proposer ran and chose nothing
    assert not any(state["tables"].values())            # and forgot every request


def test_a_cap_bounds_every_tree(runs):
    hist = runs["capped"]["proposer"][0]["stats"]["nodes_hist"]
    assert sum(hist) > 0, "capped requests drafted nothing at all"
    assert sum(hist[3:]) == 0, f"trees above the cap of 2 nodes: {hist}"


def test_mixed_steps_draft_for_the_requests_that_may(runs):
    stats = runs["mixed"]["proposer"][0]["stats"]
    assert stats["verified_trees"] > 0
    assert runs["mixed"]["metrics"]["vllm:spec_decode_num_drafts"] > 0


def test_confidence_mode_decides_greedy_requests_on_their_drafts(runs):
    """budget.gain.confidence (the default preset): greedy requests are decided on their rated
    drafts (`draft` / `declined`), never by the history rule's stopped state and probes; the
    second phase serves the first phase's prompts again, so the recent outputs give confident
    drafts that are verified (and the equality test above covers them)."""
    state = runs["confidence"]["proposer"][0]
    decisions = state["stats"]["gain_decisions"]
    assert decisions.get("draft", 0) > 0 and state["stats"]["verified_trees"] > 0
    assert decisions.get("stopped", 0) == 0 and decisions.get("probe", 0) == 0, decisions
    assert not any(state["tables"].values())            # every request's state was freed
