"""benchmarks/profile_sample_call.py: a wrapped piece counts its calls and time, each piece reads
its median over rounds in microseconds per engine step, and pieces no config ran are left out."""
from __future__ import annotations

from collections import defaultdict

from benchmark_modules import load_benchmark

profile = load_benchmark("profile_sample_call")


def _round(steps: int, seconds: dict[str, float]) -> dict:
    return {"steps": steps, "wall_s": 1.0,
            "pieces": {label: {"calls": steps if label in seconds else 0, "seconds": seconds.get(label, 0.0)}
                       for label, *_ in profile.PIECES}}


def test_a_wrapped_function_counts_calls_and_time_and_returns_its_value():
    class Owner:
        @staticmethod
        def work(x):
            return 2 * x

    totals = defaultdict(lambda: [0, 0.0])
    profile._wrap(totals, "work", Owner, "work")
    assert Owner.work(3) == 6 and Owner.work(4) == 8
    assert totals["work"][0] == 2 and totals["work"][1] > 0


def test_each_piece_is_its_median_over_rounds_per_step_and_unused_pieces_are_left_out():
    runs = {"off": [_round(1000, {"sample call": 0.080}), _round(1000, {"sample call": 0.090}),
                    _round(2000, {"sample call": 0.140})],
            "treespec": [_round(1000, {"sample call": 0.110, "    proposer step": 0.030})]}
    summary = profile.summarize(runs)
    assert summary["off"]["sample call"] == 80.0            # 80, 90 and 70 us per step
    assert summary["treespec"]["    proposer step"] == 30.0
    text = profile.table(summary)
    assert "| sample call | 80.0 | 110.0 |" in text and "| . . proposer step | - | 30.0 |" in text
    assert "bookkeeping" not in text                           # no config ran it
