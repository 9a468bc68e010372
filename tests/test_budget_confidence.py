"""budget.gain.confidence: drafts kept by their drafter's calibrated ratings (budget/confidence.py)."""
from __future__ import annotations

import numpy as np
import pytest

from vllm_treespec.budget.confidence import (GREEDY_CLASS, DraftCalibration, batch_path_probs, batch_sources,
                                           keep_prefixes, path_probs)
from vllm_treespec.budget.gain import GainControl, GainCosts
from vllm_treespec.config import ConfigError
from vllm_treespec.tree import DraftTree


def test_path_probs_multiply_along_each_path():
    chain = DraftTree([0, 5, 6, 7], [-1, 0, 1, 2], logprob=np.log([1.0, 0.5, 0.5, 0.8]))
    assert np.allclose(path_probs(chain), [0.5, 0.25, 0.2])
    tree = DraftTree([0, 5, 6, 7, 8], [-1, 0, 0, 1, 2], logprob=np.log([1.0, 0.6, 0.4, 0.5, 0.25]))
    assert np.allclose(path_probs(tree), [0.6, 0.4, 0.3, 0.1])
    assert path_probs(DraftTree([3], [-1])).size == 0


def test_batch_path_probs_match_each_trees_own():
    chains = [DraftTree([0, 5, 6], [-1, 0, 1], logprob=np.log([1.0, 0.5, 0.5])), DraftTree([1], [-1]),
              DraftTree([0, 7, 8, 9], [-1, 0, 1, 2], logprob=np.log([1.0, 0.9, 0.8, 0.5]))]
    probs, offsets = batch_path_probs(chains)
    assert offsets.tolist() == [0, 2, 2, 5]
    assert np.allclose(probs, np.concatenate([path_probs(t) for t in chains]))
    mixed = chains + [DraftTree([0, 5, 6, 7], [-1, 0, 0, 1], logprob=np.log([1.0, 0.6, 0.4, 0.5]))]
    probs, offsets = batch_path_probs(mixed)
    assert offsets.tolist() == [0, 2, 2, 5, 8] and np.allclose(probs[5:], [0.6, 0.4, 0.3])


def test_keep_prefixes_stop_at_each_trees_first_node_below_the_cost():
    worth = np.array([0.9, 0.5, 0.3, 0.6,   0.9, 0.5,   0.05, 0.9])
    offsets = np.array([0, 4, 6, 6, 8])         # four trees, the third empty
    kept, net = keep_prefixes(worth, offsets, 0.4)
    assert kept.tolist() == [2, 2, 0, 0]        # a prefix: the 0.6 after 0.3 goes too
    assert np.allclose(net, [1.4 - 0.8, 1.4 - 0.8, 0.0, 0.0])
    kept, _ = keep_prefixes(worth, offsets, 0.01)
    assert kept.tolist() == [4, 2, 0, 2]
    assert keep_prefixes(np.zeros(0), np.array([0, 0]), 0.1)[0].tolist() == [0]


def test_calibration_starts_at_the_rating_and_learns_each_class_apart():
    cal = DraftCalibration(bins=10, prior_weight=4.0)
    assert np.allclose(cal.worth("greedy", [0.95, 0.15]), [0.95, 0.15])        # prior: the bin's centre
    for _ in range(200):                      # nodes rated 0.9+ accepted half the time, greedy only
        cal.observe("greedy", np.array([0.95, 0.95]), np.array([True, False]))
    assert cal.worth("greedy", [0.95])[0] == pytest.approx(0.5, abs=0.02)   # pooled with unmeasured bins below
    assert cal.worth("0.7", [0.95])[0] == pytest.approx(0.95)                   # another class: untouched
    assert cal.observed("greedy")[9] == 400 and cal.observed("0.7").sum() == 0


def test_each_node_source_has_its_own_curve():
    """Trie guesses rated 0.95 and accepted 10% of the time do not drag down match continuations
    rated 0.85 and accepted 60% (one pooled non-decreasing curve would give both about 35%)."""
    cal = DraftCalibration(bins=20, prior_weight=4.0)
    rng = np.random.default_rng(0)
    for _ in range(300):
        cal.observe("greedy", np.array([0.97, 0.87]), rng.random(2) < np.array([0.1, 0.6]),
                    np.array([1, 0], np.int8))
    worth = cal.worth("greedy", np.array([0.97, 0.87]), np.array([1, 0], np.int8))
    assert worth[0] < 0.2 and worth[1] > 0.5
    assert cal.observed("greedy", 0).sum() == 300 and cal.observed("greedy", 1).sum() == 300
    pooled = DraftCalibration(bins=20, prior_weight=4.0)
    rng = np.random.default_rng(0)
    for _ in range(300):
        pooled.observe("greedy", np.array([0.97, 0.87]), rng.random(2) < np.array([0.1, 0.6]))
    assert 0.2 < pooled.worth("greedy", [0.87])[0] < 0.5      # what the sources keep apart
    # no sources (or all 0): the source-0 curve
    assert np.allclose(cal.worth("greedy", [0.87]), cal.worth("greedy", [0.87], np.zeros(1, np.int8)))


def test_batch_sources_follow_the_trees():
    trees = [DraftTree([1, 2, 3], [-1, 0, 1], source=[0, 0, 1]), DraftTree.chain(4, [5, 6])]
    assert batch_sources(trees).tolist() == [0, 1, 0, 0]
    assert trees[0].prefix(1).source.tolist() == [0, 0]


def test_calibrated_worth_never_falls_as_the_rating_rises():
    cal = DraftCalibration(bins=10)
    for _ in range(100):                      # a high bin measured worse than a lower one
        cal.observe("greedy", np.array([0.95, 0.55]), np.array([False, True]))
    rates = cal.rates("greedy")
    assert np.all(np.diff(rates) >= 0)
    # bins 5..9 are pooled by weight: mostly the two measured bins, each near half of its own
    assert rates[9] == pytest.approx(rates[5]) and 0.45 < rates[9] < 0.6


def test_an_unmeasured_bin_does_not_lift_a_measured_one_above_it():
    cal = DraftCalibration(bins=10, prior_weight=4.0)
    for _ in range(500):
        cal.observe("greedy", np.array([0.95]), np.array([False]))
    assert cal.worth("greedy", [0.95])[0] < 0.1          # bins 0..8 keep only their prior weight


def test_calibration_follows_the_traffic_within_its_window():
    cal = DraftCalibration(bins=4, prior_weight=1.0, window=64)
    for _ in range(64):
        cal.observe("greedy", np.array([0.9]), np.array([True]))
    assert cal.observed("greedy")[3] == 32                                       # halved at the window
    for _ in range(200):
        cal.observe("greedy", np.array([0.9]), np.array([False]))
    assert cal.worth("greedy", [0.9])[0] < 0.1                                  # the old acceptance faded


def test_calibration_settings_are_checked():
    with pytest.raises(ValueError):
        DraftCalibration(bins=0)
    with pytest.raises(ValueError):
        DraftCalibration(prior_weight=8, window=4)


def _missed(gain: GainControl):
    """A request whose own drafts were all rejected at their first node (its reach is ~0)."""
    record = gain.new_record()
    for _ in range(60):
        gain.reach.observe([record.acceptance], [5], [0])
    return record


def _one(gain, record, worth, costs):
    """decide_rated for one 5-node chain."""
    return gain.decide_rated([record], np.asarray(worth), np.array([0, 5]), costs)[0]


def test_a_rated_draft_keeps_the_nodes_that_pay_its_rows():
    gain = GainControl(8, margin=1.0)
    record = _missed(gain)
    worth = [0.9, 0.8, 0.4, 0.2, 0.1]
    d = _one(gain, record, worth, GainCosts(row=0.3, request=0.0, greedy_request=0.0))
    assert d.nodes == 3 and d.net == pytest.approx(2.1 - 0.9)
    # rows dearer than every node: nothing is kept
    assert _one(gain, record, worth, GainCosts(row=0.95, request=0.0, greedy_request=0.0)).nodes == 0
    # the margin scales the row cost
    strict = GainControl(8, margin=2.0)
    assert _one(strict, _missed(strict), worth, GainCosts(0.3, 0.0, 0.0)).nodes == 2


def _copying(gain: GainControl):
    """A request that accepted its last drafts whole (its reach is ~1 at every depth)."""
    record = gain.new_record()
    for _ in range(60):
        gain.reach.observe([record.acceptance], [5], [5])
    return record


def test_a_requests_own_reach_lifts_nodes_its_rating_undervalues():
    """A request that accepted its last drafts whole keeps a deep draft the pooled rating would
    cut; one whose drafts missed keeps only what the rating pays for; decided together in one
    step, each by its own history."""
    gain = GainControl(8, margin=1.0)
    records = [_copying(gain), _missed(gain)]
    ratings = np.array([0.6, 0.3, 0.2, 0.1, 0.1] * 2)
    offsets = np.array([0, 5, 10])
    scores = gain.node_scores(records, ratings, np.tile(np.arange(1, 6), 2), offsets)
    assert np.all(scores[:5] > 0.9) and np.allclose(scores[5:], ratings[5:], atol=0.02)
    costs = GainCosts(row=0.25, request=0.0, greedy_request=0.0)
    assert [d.nodes for d in gain.decide_rated(records, scores, offsets, costs)] == [5, 2]


def test_scores_lifted_by_history_are_calibrated_by_what_was_accepted():
    """The larger of rating and history is biased upward; calibrated on the score itself, a
    request whose history says 'copying' but whose nodes keep being rejected stops being kept
    at its history's word (calibrated on the rating alone it kept all five)."""
    gain = GainControl(8, margin=1.0)
    cal = DraftCalibration()
    record = _copying(gain)
    ratings, depths, offsets = np.full(5, 0.1), np.arange(1, 6), np.array([0, 5])
    scores = gain.node_scores([record], ratings, depths, offsets)
    costs = GainCosts(row=0.25, request=0.0, greedy_request=0.0)
    assert gain.decide_rated([record], cal.worth(GREEDY_CLASS, scores), offsets, costs)[0].nodes == 5
    for _ in range(40):                         # its history says copying; its nodes miss
        cal.observe(GREEDY_CLASS, scores, np.zeros(5, dtype=bool))
    worth = cal.worth(GREEDY_CLASS, scores)
    assert worth.max() < costs.row
    assert gain.decide_rated([record], worth, offsets, costs)[0].nodes == 0


def test_an_exploration_step_keeps_likely_nodes_whatever_rows_cost():
    """Rows priced above every node decline each rated draft, so a server that stopped drafting
    would never see a draft row again to revise the price; half way between calibration steps an
    exploration step keeps each draft's nodes worth at least EXPLORE_WORTH and goes speculative."""
    from vllm_treespec.budget.gain import EXPLORE_WORTH, decision_kind

    gain = GainControl(8, margin=1.0, calibrate_every=32)
    record = _missed(gain)
    worth = [0.9, 0.8, 0.4, 0.2, 0.1]
    dear = GainCosts(row=1.2, request=0.0, greedy_request=0.0)
    kinds = []
    for step in range(1, 65):
        gain.begin_step()
        d = _one(gain, record, worth, dear)
        if d.nodes:
            kinds.append((step, d.nodes, decision_kind(d, gain.calibrating), gain.settle([d])))
    assert EXPLORE_WORTH == 0.5
    assert kinds == [(15, 2, "explore", True), (47, 2, "explore", True)]


def test_a_rated_decision_clears_the_stopped_state():
    gain = GainControl(8)
    record = gain.new_record()
    record.waited, record.interval, record.probing = 3, 16, True
    gain.decide_rated([record], np.array([0.9]), np.array([0, 1]), GainCosts(0.0, 0.0, 0.0))
    assert (record.waited, record.interval, record.probing) == (None, None, False)


def test_confidence_is_a_checked_gain_key():
    from vllm_treespec.config import load_config

    drafter = {"type": "prompt_lookup"}
    cfg = load_config({"drafter": drafter, "budget": {"gain": {"enabled": True, "confidence": True}}})
    assert cfg.budget.gain.confidence is True
    assert load_config("lookup-online").budget.gain.confidence is True          # the default preset
    with pytest.raises(ConfigError, match="budget.gain.confidence"):
        load_config({"drafter": drafter, "budget": {"gain": {"enabled": True, "confidence": "sometimes"}}})
    assert load_config("lookup-online").budget.gain.calibrate_score is True
    with pytest.raises(ConfigError, match="budget.gain.calibrate_score"):
        load_config({"drafter": drafter, "budget": {"gain": {"enabled": True, "calibrate_score": "rating"}}})


def test_reach_many_is_each_records_reach():
    gain = GainControl(6)
    records = [gain.new_record(), _missed(gain), gain.new_record()]
    gain.reach.observe([records[2].acceptance], [4], [2])
    many = gain.reach.reach_many([r.acceptance for r in records])
    assert np.allclose(many, np.stack([gain.reach.reach(r.acceptance) for r in records]))


def _path_probs_reference(tree: DraftTree) -> np.ndarray:
    """Plain loop: a node's path log-probability is its parent's plus its own."""
    path = [0.0] * tree.num_nodes
    for i in range(1, tree.num_nodes):
        path[i] = path[int(tree.parents[i])] + float(tree.logprob[i])
    return np.exp(path[1:])


def test_batch_path_probs_match_a_plain_loop_on_random_trees():
    rng = np.random.default_rng(5)
    for _ in range(20):
        trees = []
        for _ in range(int(rng.integers(1, 6))):
            n = int(rng.integers(0, 12))
            chain = rng.random() < 0.5
            parents = [-1] + [i - 1 if chain else int(rng.integers(0, i)) for i in range(1, n + 1)]
            trees.append(DraftTree(list(range(n + 1)), parents, logprob=np.log(rng.uniform(0.2, 1.0, n + 1))))
        probs, offsets = batch_path_probs(trees)
        for t, tree in enumerate(trees):
            assert np.allclose(probs[offsets[t]:offsets[t + 1]], _path_probs_reference(tree))
