"""Sampled drafting (drafter.draft_sampling: sample) keeps the target distribution end to end:
a draft model's trees are drawn from its q and verified by recursive rejection sampling.

Target and cases: tests/sampled_cases.py (16-token random Qwen3, 5000 seeded requests per case,
chi-square against the exact law of 4-token continuations). The draft is the target with noisy
weights: close enough that many draws are accepted, different enough that rejections and
residual draws happen at every depth; it drafts branching template trees and DynaTree trees
(sampled by default: draft_sampling auto). A plain chain (one draw
per node, standard speculative sampling) is drafted by the target itself: with q = p every draw
must be accepted, which shows that each q row is aligned with the target row it is verified
against. Seeded requests reproduce exactly when batched the same way (here: one at a time); across
different batch compositions the draft model's floating-point q may differ in the last bits,
which can change a sampled draw (drafters/draft_sampling.py says so).
"""
from __future__ import annotations

import pytest

from e2e import run_engine, spec_config
from sampled_cases import CASES, ENGINE, PROMPT, check_distribution, phases

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SHAPES = {"template": {"builder": "static", "template": [3, 2, 1]},      # noisy draft
          "dynatree": {"builder": "threshold", "branch": 2, "max_depth": 4, "tau": 0.05},  # noisy
          "chain": {"builder": "chain", "max_depth": 4}}                   # the target itself


def _spec(draft, shape: str) -> dict:
    drafter = {"type": "draft_model", "path": str(draft), "max_cached_requests": 256, "memory_mb": 256}
    if shape != "dynatree":                 # dynatree: the default (auto) samples for threshold
        drafter["draft_sampling"] = "sample"
    return dict(speculative_config=spec_config(8),
                additional_config={"treespec": {"drafter": drafter, "tree": SHAPES[shape]}})


@pytest.fixture(scope="module")
def sampled(tiny_vocab_model, noisy_draft):
    drafts = {"template": noisy_draft, "dynatree": noisy_draft, "chain": tiny_vocab_model}
    return {shape: run_engine(tiny_vocab_model, {**ENGINE, **_spec(drafts[shape], shape)},
                              phases(False) + (_seeded_one_at_a_time() if shape == "template" else []),
                              inspect_proposer=True)
            for shape in SHAPES}


def _seeded_one_at_a_time(n: int = 150) -> list[dict]:
    sampling = [dict(temperature=1.0, max_tokens=8, ignore_eos=True, detokenize=False, seed=i)
                for i in range(n)]
    return [{"name": name, "concurrency": 1, "prompts": [PROMPT] * n, "sampling": sampling}
            for name in ("seeded-c1", "seeded-c1-again")]


@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("case", list(CASES))
def test_sampled_drafts_keep_the_target_distribution(sampled, tiny_vocab_model, shape, case):
    check_distribution(tiny_vocab_model, sampled[shape], case)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_drafts_were_sampled_and_accepted(sampled, shape):
    state = sampled[shape]["proposer"][0]
    assert state["drafter"]["sampled_trees"] > 1000
    stats = state["stats"]
    if shape != "chain":
        # the noisy draft is often right: ~0.2 accepted per tree, fewer in a request's last steps,
        # where trees shrink to the tokens max_tokens leaves (an all-rejecting verifier gives 0)
        assert stats["accepted"] > 0.1 * stats["verified_trees"]
        assert stats["kv_moves"] > 0                              # accepted off the first chain
    else:
        assert stats["accepted"] > 0.99 * stats["verified_nodes"]  # q = p: every draw accepted


def test_seeded_requests_reproduce(sampled):
    outs = {p["name"]: [o["token_ids"] for o in p["outputs"]] for p in sampled["template"]["phases"]}
    assert outs["seeded-c1"] == outs["seeded-c1-again"]
    assert len({tuple(t) for t in outs["seeded-c1"]}) > 50        # the seeds do sample


@pytest.mark.parametrize("shape", list(SHAPES))
def test_every_per_request_table_is_freed(sampled, shape):
    """Thousands of short sampled requests, each holding q rows and a seeded drafter generator
    while it ran: once they finished, the proposer and the drafter hold nothing of them."""
    tables = sampled[shape]["proposer"][0]["tables"]
    assert tables and "drafter.cache_slots" in tables and not any(tables.values()), tables
