"""benchmarks/replay_tau.py: the acceptance replay with several requests in flight, as the
engine batches them, and drafters that learn from finished outputs."""
from __future__ import annotations

import importlib.util

import numpy as np
import pytest
from benchmark_modules import load_benchmark

from vllm_treespec.config import load_config
from vllm_treespec.drafters import make_drafter

replay_tau = load_benchmark("replay_tau")

# four requests that write the same 30 tokens after different prompts
RECORDS = [{"prompt_ids": [1 + r, 2, 3], "output_ids": list(range(10, 40))} for r in range(4)]


def _online_drafter():
    cfg = load_config({"drafter": {"type": "lookup_trie", "path": None, "online_mb": 1,
                                   "recent_max_ngram": 16},
                       "tree": {"builder": "chain", "max_depth": 32}}, 24)
    return make_drafter(cfg.drafter, None, cfg.tree, vocab_limit=64, max_nodes=24)


@pytest.mark.parametrize("concurrency", [1, 3, 8])
def test_every_token_is_replayed_once_at_any_concurrency(concurrency):
    row = replay_tau.replay(_online_drafter(), 24, RECORDS, max_len=64, concurrency=concurrency)
    total = sum(len(r["output_ids"]) - 1 for r in RECORDS)
    assert row["steps"] + row["accepted"] == total        # each step: its accepted tokens + 1
    assert row["tokens_per_step"] == pytest.approx(total / row["steps"])


def test_requests_in_flight_together_cannot_learn_from_each_other():
    """One at a time, each later request drafts the first one's finished output; all four in
    flight at once, nothing has finished while they run, so nothing is drafted."""
    one = replay_tau.replay(_online_drafter(), 24, RECORDS, max_len=64, concurrency=1)
    four = replay_tau.replay(_online_drafter(), 24, RECORDS, max_len=64, concurrency=4)
    assert one["accepted"] >= 3 * 25 and one["steps"] < 29 + 3 * 3
    assert four["accepted"] == 0 and four["steps"] == 4 * 29


def test_drafters_reading_target_states_replay_one_request_at_a_time():
    with pytest.raises(ValueError, match="concurrency 1 only"):
        replay_tau.replay(_online_drafter(), 24, RECORDS, max_len=64, features=[[]] * 4, concurrency=2)


@pytest.mark.skipif(importlib.util.find_spec("arctic_inference") is None,
                    reason="vLLM's suffix method needs arctic-inference (benchmarks/install_suffix.sh)")
def test_the_suffix_replay_drafts_a_finished_output():
    row = replay_tau.replay(replay_tau.SuffixReplay(), 24, RECORDS, max_len=64, concurrency=1)
    assert row["accepted"] >= 3 * 20 and np.isfinite(row["tau"])


def test_the_rating_table_counts_every_drafted_node_and_its_acceptance():
    row = replay_tau.replay(_online_drafter(), 24, RECORDS, max_len=64, concurrency=1)
    assert sum(r["nodes"] for r in row["ratings"]) == round(row["mean_nodes"] * row["steps"] * row["drafted_share"])
    hits = sum(r["nodes"] * r["accepted_share"] for r in row["ratings"])
    assert hits == pytest.approx(row["accepted"])          # no output is cut short by max_tokens here
    assert all(0.0 <= r["accepted_share"] <= 1.0 for r in row["ratings"])


def test_modeled_speedup_prices_rows_and_speculative_steps():
    free = replay_tau.replay(_online_drafter(), 24, RECORDS, max_len=64, costs=(0.0, 0.0))
    total = sum(len(r["output_ids"]) - 1 for r in RECORDS)
    assert free["modeled_speedup"] == pytest.approx(free["tokens_per_step"])
    assert free["rows_verified"] == round(free["mean_nodes"] * free["drafted_share"] * free["steps"])
    priced = replay_tau.replay(_online_drafter(), 24, RECORDS, max_len=64, costs=(0.1, 0.5))
    assert priced["modeled_speedup"] == pytest.approx(
        total / (priced["steps"] + 0.1 * priced["rows_verified"] + 0.5 * priced["speculative_steps"]))
    assert priced["modeled_speedup"] < free["modeled_speedup"]


def test_the_confidence_cut_drops_drafts_that_cannot_pay_and_keeps_free_ones():
    uncut = replay_tau.replay(_online_drafter(), 24, RECORDS, max_len=64, costs=(0.0, 0.0))
    free = replay_tau.replay(_online_drafter(), 24, RECORDS, max_len=64, costs=(0.0, 0.0), prune_margin=1.5)
    assert free["rows_verified"] == uncut["rows_verified"] and free["accepted"] == uncut["accepted"]
    dear = replay_tau.replay(_online_drafter(), 24, RECORDS, max_len=64, costs=(1.5, 0.0), prune_margin=1.0)
    total = sum(len(r["output_ids"]) - 1 for r in RECORDS)
    assert dear["rows_verified"] == 0 and dear["steps"] == total      # no node is worth 1.5 tokens
    step = replay_tau.replay(_online_drafter(), 24, RECORDS, max_len=64, costs=(0.0, 100.0), prune_margin=1.0)
    assert step["speculative_steps"] == 0                             # no draft pays a 100-token step


def test_the_ngram_replay_copies_the_requests_own_repeats_up_to_its_budget():
    """vLLM's ngram over the replay: the prompt repeats a 5-token cycle that the output goes on
    repeating, so every step after the first drafts `budget` tokens and accepts them all."""
    cycle = [5, 6, 7, 8, 9]
    records = [{"prompt_ids": cycle * 2, "output_ids": cycle * 4}]
    row = replay_tau.replay(replay_tau.NgramReplay(), 3, records, max_len=64, ratings=False)
    assert row["mean_nodes"] == pytest.approx(3.0)
    assert row["accepted"] >= 3 * (row["drafted_steps"] - 1)
