"""budget/reach.py: depth caps per sampling class from measured acceptance."""
from __future__ import annotations

import numpy as np
import pytest

from vllm_treespec.budget.reach import GREEDY, SAMPLED, ReachCap


def _feed(cap: ReachCap, cls: str, accept_prob: float, steps: int, rng: np.random.Generator) -> None:
    """Steps of one request each: drafts as deep as the class's cap, every node accepted with
    accept_prob given its parent was (geometric acceptance)."""
    for _ in range(steps):
        depth = cap.cap(cls)
        accepted = 0
        while accepted < depth and rng.random() < accept_prob:
            accepted += 1
        cap.observe([cls], [depth], [accepted])


def test_sampling_class_follows_vllm_epsilon():
    assert ReachCap.sampling_class(None) == GREEDY
    assert ReachCap.sampling_class(0.0) == GREEDY
    assert ReachCap.sampling_class(5e-6) == GREEDY
    assert ReachCap.sampling_class(0.7) == SAMPLED


def test_cap_starts_full_and_settles_where_reach_meets_the_floor():
    rng = np.random.default_rng(0)
    cap = ReachCap(0.05, max_depth=32)
    assert cap.state() == {GREEDY: 32, SAMPLED: 32}
    _feed(cap, SAMPLED, 0.5, 2000, rng)
    _feed(cap, GREEDY, 0.97, 2000, rng)
    # 0.5^4 = 0.0625 >= 0.05 > 0.5^5; 0.97^32 = 0.38: the greedy class keeps every level
    assert cap.cap(SAMPLED) in (3, 4, 5)
    assert cap.cap(GREEDY) == 32
    reach = cap.reach(SAMPLED)
    assert np.all(np.diff(reach) <= 0) and reach[0] == pytest.approx(0.5, abs=0.08)


def test_a_lowered_cap_grows_back_when_acceptance_rises():
    rng = np.random.default_rng(1)
    cap = ReachCap(0.05, max_depth=32)
    _feed(cap, SAMPLED, 0.3, 1500, rng)
    low = cap.cap(SAMPLED)
    assert low <= 3
    _feed(cap, SAMPLED, 0.98, 1500, rng)
    assert cap.cap(SAMPLED) >= 20 > low


def test_cap_never_drops_below_one_and_classes_are_independent():
    cap = ReachCap(0.5, max_depth=8)
    for _ in range(300):
        cap.observe([SAMPLED], [8], [0])
    assert cap.cap(SAMPLED) == 1 and cap.cap(GREEDY) == 8


def test_observations_are_clipped_to_the_tree():
    cap = ReachCap(0.1, max_depth=4)
    cap.observe([GREEDY, GREEDY], [9, 2], [12, 5])     # deeper than max_depth; accepted > depth
    assert cap.reached[GREEDY].tolist() == [2.0, 2.0, 1.0, 1.0]
    assert cap.accepted[GREEDY].tolist() == [2.0, 2.0, 1.0, 1.0]
    cap.observe([GREEDY], [0], [0])                     # a root-only tree says nothing
    assert cap.reached[GREEDY].tolist() == [2.0, 2.0, 1.0, 1.0]


@pytest.mark.parametrize("kwargs, match", [
    (dict(floor=0.0, max_depth=4), "floor must be in"),
    (dict(floor=1.0, max_depth=4), "floor must be in"),
    (dict(floor=0.1, max_depth=0), "max_depth >= 1"),
    (dict(floor=0.1, max_depth=4, prior=0.0), "0 < prior <= 1"),
    (dict(floor=0.1, max_depth=4, decay=1.0), "0 <= decay < 1"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ReachCap(**kwargs)


def test_observe_needs_one_entry_per_request():
    with pytest.raises(ValueError, match="one entry per drafted request"):
        ReachCap(0.1, max_depth=4).observe([GREEDY], [2, 3], [1])


def test_reach_caps_reach_stats_and_the_prometheus_gauge():
    from prometheus_client import CollectorRegistry

    from vllm_treespec.engine.metrics import TreeMetrics
    from vllm_treespec.engine.tree_stats import TreeStats

    registry = CollectorRegistry()
    stats = TreeStats(8, metrics=TreeMetrics(registry))
    stats.observe_reach({GREEDY: 8, SAMPLED: 3})
    assert stats.summary()["reach_caps"] == {GREEDY: 8, SAMPLED: 3}
    assert registry.get_sample_value("treespec_reach_cap_nodes", {"sampling": SAMPLED}) == 3
    assert registry.get_sample_value("treespec_reach_cap_nodes", {"sampling": GREEDY}) == 8
