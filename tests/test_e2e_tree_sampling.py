"""Sampled outputs keep the target distribution with tree speculation (chi-square), and seeded
requests reproduce exactly across runs.

Fixture and cases: tests/sampled_cases.py. Prompt lookup drafts branching trees from several
matches of the repetitive prompts (top-k trees, target-only rule). The spec-off run is the
control: it shows the reference and the test are right, so a failure with trees on points at
tree verification.
"""
from __future__ import annotations

import pytest

from e2e import run_engine, spec_config
from sampled_cases import CASES, ENGINE, check_distribution, check_seeded_repeats, phases

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

TREES = dict(speculative_config=spec_config(8),
             additional_config={"treespec": {"drafter": {"type": "prompt_lookup", "max_matches": 8},
                                             "tree": {"builder": "best_first"}}})


@pytest.fixture(scope="module")
def sampled(tiny_vocab_model):
    return {"off": run_engine(tiny_vocab_model, ENGINE, phases(False)),
            "on": run_engine(tiny_vocab_model, {**ENGINE, **TREES}, phases(True), inspect_proposer=True)}


@pytest.mark.parametrize("case", list(CASES))
def test_tree_sampling_matches_target_distribution(sampled, tiny_vocab_model, case):
    for run in ("off", "on"):
        check_distribution(tiny_vocab_model, sampled[run], case)


def test_trees_branched_and_accepted_while_sampling(sampled):
    stats = sampled["on"]["proposer"][0]["stats"]
    assert stats["verified_trees"] > 1000 and stats["accepted"] > 500
    assert stats["kv_moves"] > 0            # accepted paths left the node prefix: real branches


def test_seeded_requests_reproduce(sampled):
    check_seeded_repeats(sampled["on"])
