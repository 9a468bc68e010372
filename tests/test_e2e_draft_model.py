"""External draft models end to end (issue 7): greedy output with draft-model trees is bitwise
equal to speculation off, through a real vLLM engine (offline `LLM`, CPU, code-LM target).

Drafters: the transformer draft-lm fixture with DynaTree threshold trees and with best-first trees
(prefetched expansions), the same drafter with too few cache slots for the batch (requests
without a slot decode without drafts), and the Mamba draft fixture with the UCB template bandit. Phases: concurrency 1 and 8 with varied max_tokens,
aborts mid-generation (every other request, then a normal phase on the same engine), and a tiny
KV cache that forces preemption (the drafter cache must resync when a preempted request resumes).
"""
from __future__ import annotations

import pytest

from e2e import assert_same_outputs, greedy, run_engine, spec_config
from vllm_treespec.train import corpus
from vllm_treespec.tree.bandit import MAMBA_TEMPLATES

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=1024, max_num_seqs=16, seed=0,
              block_size=32, enable_prefix_caching=True, enable_chunked_prefill=True,
              max_num_batched_tokens=256)
DYNATREE = {"drafter": {"type": "draft_model", "path": "fixture:draft-lm"},
            "tree": {"builder": "threshold", "branch": 3, "max_depth": 6, "tau": 0.03}}
FEW_SLOTS = {"drafter": {"type": "draft_model", "path": "fixture:draft-lm", "max_cached_requests": 3},
             "tree": {"builder": "threshold", "branch": 2, "max_depth": 4, "tau": 0.05}}
MAMBA_BANDIT = {"drafter": {"type": "draft_model", "path": "fixture:mamba-draft-lm",
                            "templates": [list(t) for t in MAMBA_TEMPLATES]},
                "tree": {"builder": "static"}}
# best_first expands the next likeliest nodes ahead of their turn (tree.prefetch, 4 by default)
BEST_FIRST = {"drafter": {"type": "draft_model", "path": "fixture:draft-lm"},
              "tree": {"builder": "best_first", "topk": 4, "max_depth": 8}}
CONFIGS = {"dynatree-16": (16, DYNATREE), "few-slots-8": (8, FEW_SLOTS), "mamba-bandit-16": (16, MAMBA_BANDIT),
           "best-first-16": (16, BEST_FIRST)}
PROMPTS = corpus.held_out_prompts(32, prompt_chars=400, seed=21)


def _spec(name: str) -> dict:
    k, cfg = CONFIGS[name]
    return dict(speculative_config=spec_config(k), additional_config={"treespec": cfg})


PHASES = [
    {"name": "c1", "concurrency": 1, "prompts": PROMPTS[:12], "sampling": [greedy(16 + 3 * i) for i in range(12)]},
    {"name": "c8", "concurrency": 8, "prompts": PROMPTS, "sampling": [greedy(40)] * 32},
    {"name": "aborts", "concurrency": 0, "prompts": PROMPTS[:8], "abort_after_steps": 5,
     "sampling": [greedy(200) if i % 2 == 0 else greedy(24) for i in range(8)]},
    {"name": "after-aborts", "concurrency": 8, "prompts": PROMPTS[8:16], "sampling": [greedy(32)] * 8},
]


@pytest.fixture(scope="module")
def runs(code_lm_model):
    out = {"off": run_engine(code_lm_model, ENGINE, PHASES)}
    for name in CONFIGS:
        out[name] = run_engine(code_lm_model, {**ENGINE, **_spec(name)}, PHASES, inspect_proposer=True)
    return out


@pytest.mark.parametrize("name", list(CONFIGS))
def test_greedy_equal_with_draft_model_trees(runs, name):
    assert_same_outputs(runs["off"], runs[name])


@pytest.mark.parametrize("name", list(CONFIGS))
def test_draft_model_trees_were_verified_and_accepted(runs, name):
    stats = runs[name]["proposer"][0]["stats"]
    assert stats["verified_trees"] > 50 and stats["accepted"] > 0
    assert stats["accepted"] <= stats["verified_nodes"]
    if name != "few-slots-8":
        assert stats["kv_moves"] > 0, "no accepted path left the node prefix: not a branching tree"


def test_aborts_happened(runs):
    outs = {p["name"]: p["outputs"] for p in runs["off"]["phases"]}["aborts"]
    assert [o["finish_reason"] for o in outs[0::2]] == ["aborted"] * 4
    assert all(o["finish_reason"] == "length" for o in outs[1::2])


def test_requests_without_a_cache_slot_decode_without_drafts(runs):
    """3 slots for batches of 8: the others draft nothing those steps (bounded memory)."""
    state = runs["few-slots-8"]["proposer"][0]
    assert state["stats"]["verified_trees"] > 0
    assert state["drafter"]["no_slot"] > 0, "every request got a cache slot: admission untested"


TINY_KV = dict(dtype="float32", enforce_eager=True, max_model_len=512, max_num_seqs=8, seed=0,
               block_size=32, num_gpu_blocks_override=24)
PREEMPT = [{"name": "preemption", "concurrency": 8, "prompts": PROMPTS[:8], "sampling": [greedy(128)] * 8}]


@pytest.fixture(scope="module")
def preempt_runs(code_lm_model):
    out = {"off": run_engine(code_lm_model, TINY_KV, PREEMPT)}
    for name in ("dynatree-16", "mamba-bandit-16"):
        out[name] = run_engine(code_lm_model, {**TINY_KV, **_spec(name)}, PREEMPT, inspect_proposer=True)
    return out


@pytest.mark.parametrize("name", ["dynatree-16", "mamba-bandit-16"])
def test_greedy_equal_under_preemption_with_draft_models(preempt_runs, name):
    assert preempt_runs[name]["metrics"].get("vllm:num_preemptions", 0) > 0, "no preemption happened"
    assert preempt_runs[name]["proposer"][0]["stats"]["verified_trees"] > 0
    assert_same_outputs(preempt_runs["off"], preempt_runs[name])
