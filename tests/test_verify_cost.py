"""The served verify-cost curve's arithmetic (benchmarks/verify_cost.py)."""
from __future__ import annotations

from benchmark_modules import load_benchmark

vc = load_benchmark("verify_cost")


def test_random_prompt_draws_from_the_alphabet_only():
    p = vc.random_prompt(4000, 100, seed=1)
    assert len(p) == 4000 and set(p) == set(range(100, 100 + vc.ALPHABET))
    assert vc.random_prompt(50, 100, seed=1) == p[:50] and vc.random_prompt(50, 100, seed=2) != p[:50]


def test_step_seconds_counts_steps_after_the_prefill():
    # 33 tokens, 8 of them accepted drafts: 25 steps, the first with the prefill
    assert vc.step_seconds(3.4, 1.0, 33, 8.0) == 2.4 / 24
    assert vc.step_seconds(1.0, 1.0, 1, 0.0) is None
