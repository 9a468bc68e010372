"""Load-dependent budgets end to end (budget.mode table and auto): greedy outputs equal
speculation off; a table giving one request 6 nodes and two or more requests 0 drafts at
concurrency 1 and decodes plainly (no tree verified, no drafter call; its steps a quiet
stretch's, sampled as vLLM's plain steps) when 8 requests decode together; auto mode profiles
the verify cost at startup, learns from served steps and stays lossless; budget.reach_floor
caps drafts from the acceptance it measures and stays lossless."""
from __future__ import annotations

import pytest

from e2e import assert_same_outputs, greedy, run_engine, spec_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=512, max_num_seqs=8, seed=0)
PROMPT = "for i in range(10):\n    print(i)\n" * 3
DRAFTER = {"type": "prompt_lookup", "max_matches": 8}
TREE = {"builder": "best_first"}
TABLE = {"mode": "table", "table": [{"batch": [1, 1], "nodes": 6}, {"batch": [2, None], "nodes": 0}]}


def _phase(concurrency: int) -> list[dict]:
    # 8 copies of one prompt with one max_tokens: all decode together and finish in the same step
    return [{"name": f"c{concurrency}", "concurrency": concurrency, "prompts": [PROMPT] * 8,
             "sampling": [greedy(32)] * 8}]


@pytest.fixture(scope="module")
def runs(tiny_model):
    out = {}
    for c in (1, 8):
        out["off", c] = run_engine(tiny_model, ENGINE, _phase(c))
        for mode, budget in (("table", TABLE), ("auto", {"mode": "auto", "auto": {"explore_every": 4}})):
            spec = dict(speculative_config=spec_config(6), additional_config={"treespec": {
                "drafter": DRAFTER, "tree": TREE, "budget": budget}})
            out[mode, c] = run_engine(tiny_model, {**ENGINE, **spec}, _phase(c), inspect_proposer=True)
    # a table rule overriding the tree's depth: one request alone drafts trees 1 deep
    spec = dict(speculative_config=spec_config(6), additional_config={"treespec": {
        "drafter": DRAFTER, "tree": TREE, "budget": {"mode": "table", "table": [
            {"batch": [1, 1], "nodes": 6, "max_depth": 1}, {"batch": [2, None], "nodes": 6}]}}})
    out["depth-rule", 1] = run_engine(tiny_model, {**ENGINE, **spec}, _phase(1), inspect_proposer=True)
    # budget.reach_floor: caps learnt from acceptance while serving
    for c in (1, 8):
        spec = dict(speculative_config=spec_config(6), additional_config={"treespec": {
            "drafter": DRAFTER, "tree": TREE, "budget": {"reach_floor": 0.3}}})
        out["reach", c] = run_engine(tiny_model, {**ENGINE, **spec}, _phase(c), inspect_proposer=True)
    return out


@pytest.mark.parametrize("mode", ["table", "auto"])
@pytest.mark.parametrize("concurrency", [1, 8])
def test_budget_modes_are_lossless(runs, mode, concurrency):
    assert_same_outputs(runs["off", concurrency], runs[mode, concurrency])
    assert runs[mode, concurrency]["proposer"][0]["budget"]["mode"] == mode


def test_table_drafts_alone_and_decodes_plainly_under_load(runs):
    alone = runs["table", 1]["proposer"][0]["stats"]
    loaded = runs["table", 8]["proposer"][0]["stats"]
    assert alone["verified_trees"] > 0 and {int(b) for b in alone["budget_choices"]} == {6}
    # per request the table's 6 nodes, less in a request's last steps (no drafts past max_tokens)
    assert 4 < alone["mean_budget"] < 6
    # the first decode step can see a single request before the others join the batch
    assert loaded["verified_trees"] <= 1 and loaded["mean_budget"] < 0.5
    # under load the table's 0 nodes make the batch's steps a quiet stretch (no budget.gain:
    # BudgetControl._unbudgeted_stretch), which vLLM samples as plain steps
    assert loaded["plain_quiet_steps"] > 20 and alone["plain_quiet_steps"] == 0


@pytest.mark.parametrize("concurrency", [1, 8])
def test_auto_profiles_verify_cost_at_startup(runs, concurrency):
    state = runs["auto", concurrency]["proposer"][0]
    # max_num_seqs 8 x (1 + 6 nodes) = 56 query tokens at most
    assert [q for q, _ in state["budget"]["profile"]] == [1, 2, 4, 8, 16, 32, 56]
    assert all(s > 0 for _, s in state["budget"]["profile"])
    choices = state["stats"]["budget_choices"]
    assert sum(choices.values()) > 0 and {int(b) for b in choices} <= {0, 1, 2, 4, 6}   # JSON keys


def test_table_rule_tree_overrides_reach_the_drafter(runs):
    assert_same_outputs(runs["off", 1], runs["depth-rule", 1])
    capped = runs["depth-rule", 1]["proposer"][0]["stats"]
    free = runs["table", 1]["proposer"][0]["stats"]          # same drafter and budget, no depth rule
    assert capped["verified_trees"] > 0 and sum(capped["depth_hist"][2:]) == 0
    # 1-deep trees hold only the distinct next tokens of the prompt's matches; without the rule
    # the lookup fills the 6-node budget with deeper continuations
    per_tree = lambda s: s["verified_nodes"] / s["verified_trees"]
    assert per_tree(capped) < 4 < per_tree(free)


@pytest.mark.parametrize("concurrency", [1, 8])
def test_reach_floor_is_lossless_and_learns_caps(runs, concurrency):
    assert_same_outputs(runs["off", concurrency], runs["reach", concurrency])
    state = runs["reach", concurrency]["proposer"][0]
    assert state["stats"]["verified_trees"] > 0
    caps = state["stats"]["reach_caps"]          # mean cap of the live requests at the last step
    assert set(caps) == {"greedy"} and 1 <= caps["greedy"] <= 6
