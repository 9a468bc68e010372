"""budget/reach.py: per-request depth caps from measured acceptance."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from vllm_treespec.budget.reach import GREEDY, SAMPLED, ReachCap, ReachRecord


def _feed(cap: ReachCap, req: ReachRecord, accept_prob: float, steps: int, rng: np.random.Generator) -> None:
    """Steps of one request: drafts as deep as its cap, every node accepted with accept_prob
    given its parent was (geometric acceptance)."""
    for _ in range(steps):
        depth = cap.cap(req)
        accepted = 0
        while accepted < depth and rng.random() < accept_prob:
            accepted += 1
        cap.observe([req], [depth], [accepted])


def test_sampling_class_follows_vllm_epsilon():
    assert ReachCap.sampling_class(None) == GREEDY
    assert ReachCap.sampling_class(0.0) == GREEDY
    assert ReachCap.sampling_class(5e-6) == GREEDY
    assert ReachCap.sampling_class(0.7) == SAMPLED


def test_cap_starts_full_and_settles_where_reach_meets_the_floor():
    rng = np.random.default_rng(0)
    cap = ReachCap(0.05, max_depth=32)
    low, high = cap.new_record(), cap.new_record()
    assert cap.cap(None) == cap.cap(low) == 32
    assert np.array_equal(cap.reach(None), cap.reach(low))
    _feed(cap, low, 0.5, 300, rng)
    _feed(cap, high, 0.97, 300, rng)
    # 0.5^4 = 0.0625 >= 0.05 > 0.5^5; 0.97^32 = 0.38: the other request keeps every level
    assert cap.cap(low) in (3, 4, 5, 6)
    assert cap.cap(high) == 32
    reach = cap.reach(low)
    assert np.all(np.diff(reach) <= 0) and reach[0] == pytest.approx(0.5, abs=0.15)


def test_a_request_learns_within_a_few_steps():
    rng = np.random.default_rng(2)
    cap = ReachCap(0.02, max_depth=32)
    r = cap.new_record()
    _feed(cap, r, 0.4, 15, rng)
    assert cap.cap(r) <= 16           # from 32: unexplored depths keep the optimistic prior


def test_a_lowered_cap_grows_back_when_acceptance_rises():
    rng = np.random.default_rng(1)
    cap = ReachCap(0.05, max_depth=32)
    r = cap.new_record()
    _feed(cap, r, 0.3, 200, rng)
    low = cap.cap(r)
    assert low <= 4
    _feed(cap, r, 0.98, 300, rng)
    assert cap.cap(r) >= 20 > low


def test_requests_are_independent():
    """A request's cap depends on its own drafts only: the same history gives the same caps,
    whatever other requests do (seeded requests stay reproducible)."""
    cap = ReachCap(0.5, max_depth=8)
    a, b, alone = cap.new_record(), cap.new_record(), cap.new_record()
    for _ in range(30):
        cap.observe([a, b], [8, 8], [0, 8])
        cap.observe([alone], [8], [8])
    assert cap.cap(a) == 1 and cap.cap(b) == cap.cap(alone) == 8
    assert np.array_equal(cap.reach(b), cap.reach(alone))


def test_the_rule_keeps_no_reference_to_a_request():
    """A request's counts and cap live in its record only: dropping the record frees them."""
    cap = ReachCap(0.5, max_depth=8)
    r = cap.new_record()
    cap.observe([r], [8], [2])
    cap.reach(r)
    gone = weakref.ref(r)
    del r
    gc.collect()
    assert gone() is None


def test_observations_are_clipped_to_the_tree():
    cap = ReachCap(0.1, max_depth=4, decay=0.0)
    r = cap.new_record()
    cap.observe([r, r], [9, 2], [12, 5])               # deeper than max_depth; accepted > depth
    assert r.reached.tolist() == [2.0, 2.0, 1.0, 1.0] and r.accepted.tolist() == [2.0, 2.0, 1.0, 1.0]
    cap.observe([r], [0], [0])                          # a root-only tree says nothing
    assert r.reached.tolist() == [2.0, 2.0, 1.0, 1.0]


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
    cap = ReachCap(0.1, max_depth=4)
    with pytest.raises(ValueError, match="one entry per drafted request"):
        cap.observe([cap.new_record()], [2, 3], [1])


def test_reach_caps_reach_stats_and_the_prometheus_gauge():
    from prometheus_client import CollectorRegistry

    from vllm_treespec.engine.metrics import TreeMetrics
    from vllm_treespec.engine.tree_stats import TreeStats

    registry = CollectorRegistry()
    stats = TreeStats(8, metrics=TreeMetrics(registry, model_name="m"))
    stats.observe_reach({GREEDY: 8.0, SAMPLED: 2.5})
    stats.flush_metrics()
    assert stats.summary()["reach_caps"] == {GREEDY: 8.0, SAMPLED: 2.5}
    assert registry.get_sample_value("treespec_reach_cap_nodes", {"model_name": "m", "sampling": SAMPLED}) == 2.5
    assert registry.get_sample_value("treespec_reach_cap_nodes", {"model_name": "m", "sampling": GREEDY}) == 8.0


def test_a_rule_that_keeps_no_caps_still_learns_reach():
    """budget.gain's reach rule reads only `reach`: its records' caps are not recomputed."""
    capless = ReachCap(0.5, 4, keeps_caps=False)
    capped = ReachCap(0.5, 4)
    a, b = capless.new_record(), capped.new_record()
    for _ in range(20):
        capless.observe([a], [4], [0])
        capped.observe([b], [4], [0])
    assert a.cap == 4 and b.cap == 1
    np.testing.assert_array_equal(capless.reach(a), capped.reach(b))
