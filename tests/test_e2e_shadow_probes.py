"""Shadow probes end to end (budget/shadow.py), through a real vLLM engine (offline `LLM`, CPU,
fp32): with budget.gain stopping requests whose drafts do not pay, their probes are drafted but
not verified and are settled by the tokens the requests sample next; greedy outputs stay equal
to speculation off, in steps shared with unseeded sampled requests."""
from __future__ import annotations

import pytest

from e2e import greedy, run_engine, spec_config
from vllm_treespec.train import corpus

pytestmark = pytest.mark.e2e

K = 8
ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=1024, max_num_seqs=8, seed=0)
# a margin of 100 prices every measured row out, so requests stop drafting and are probed often
SPEC = dict(speculative_config=spec_config(K), additional_config={"treespec": {
    "drafter": {"type": "prompt_lookup"},
    "budget": {"gain": {"enabled": True, "probe_every": 2, "max_probe_every": 4, "margin": 100.0}}}})
PROMPTS = corpus.held_out_prompts(8, prompt_chars=400, seed=5)
SAMPLING = [greedy(48) if i % 2 == 0 else {"temperature": 0.8, "max_tokens": 48} for i in range(len(PROMPTS))]
PHASES = [{"name": "concurrency-4", "concurrency": 4, "prompts": PROMPTS, "sampling": SAMPLING}]


@pytest.fixture(scope="module")
def runs(tiny_model):
    return {"off": run_engine(tiny_model, ENGINE, PHASES),
            "on": run_engine(tiny_model, {**ENGINE, **SPEC}, PHASES, inspect_proposer=True)}


def test_greedy_outputs_equal_speculation_off_beside_shadow_probes(runs):
    off, on = runs["off"]["phases"][0]["outputs"], runs["on"]["phases"][0]["outputs"]
    for i in range(0, len(PROMPTS), 2):
        assert off[i]["token_ids"] == on[i]["token_ids"], f"greedy request {i}"
    assert all(len(out["token_ids"]) == 48 or out["finish_reason"] == "stop" for out in on)


def test_probes_are_settled_by_sampled_tokens(runs):
    state = runs["on"]["proposer"][0]
    stats = state["stats"]
    assert stats["gain_decisions"].get("probe", 0) > 0, stats["gain_decisions"]
    assert stats["shadow_probes"] > 0
    assert 0 <= stats["shadow_accepted"] <= 2 * stats["shadow_probes"]     # 2-node probes
    assert not any(state["tables"].values())            # every request's state was freed


def test_quiet_steps_are_sampled_as_plain_steps(runs):
    """Between probes the stopped requests form quiet stretches whose steps vLLM samples as
    plain steps (engine/runner_patches.py `sample_tokens`): the greedy outputs above came
    through such steps."""
    stats = runs["on"]["proposer"][0]["stats"]
    assert stats["plain_quiet_steps"] > 0, stats
