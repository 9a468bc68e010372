"""budget.gain (budget/gain.py): step-cost fit, per-request decisions, probes, determinism."""
from __future__ import annotations

import gc
import weakref

import numpy as np
import pytest

from vllm_treespec.budget.gain import GainControl, GainCosts, GainRecord, StepCost
from vllm_treespec.config import ConfigError, load_config


def _feed(cost: StepCost, steps: list[tuple[float, int, int, int, float]], repeat: int = 50) -> None:
    """steps: (seconds, decoding requests, verified draft rows, emitted tokens, measured overhead)."""
    for _ in range(repeat):
        for seconds, requests, draft_rows, emitted, overhead in steps:
            cost.observe(seconds, requests, draft_rows, emitted, overhead)


# (decoding requests, verified draft rows) of the steps below: plain steps at several batch sizes,
# speculative steps with trees of several sizes
_SHAPES = [(1, 0), (1, 3), (1, 8), (4, 16), (2, 0), (8, 32), (8, 0), (4, 0), (8, 5)]


def test_step_cost_recovers_base_request_row_and_overhead():
    cost = StepCost(forget=0.01)
    # truth: 1.0 ms + 0.2 ms per request + 0.07 ms per draft row, + 0.8 ms measured overhead
    steps = [(1e-3 + 2e-4 * q + 7e-5 * d + (8e-4 if d else 0.0), q, d, q, 8e-4 if d else 0.0)
             for q, d in _SHAPES]
    _feed(cost, steps)
    fit = cost.coefficients()
    assert fit.row == pytest.approx(7e-5, rel=0.05)
    assert fit.request == pytest.approx(2e-4, rel=0.05)
    assert fit.speculative == pytest.approx(8e-4, rel=0.01)
    assert fit.base == pytest.approx(1e-3, rel=0.1)


def test_a_draft_row_is_priced_apart_from_a_request():
    """Served, a request costs its step the engine's per-request work besides its row; a draft
    row adds its row alone. One slope for both, fitted mostly on plain steps of varying batch,
    priced a draft row near the whole per-request cost (docs/never-slower.md section 2)."""
    gain = GainControl(16)
    for _ in range(100):
        for q in (8, 16, 24, 32):
            gain.observe_step(2e-3 + 5e-4 * q, q, 0, q)                       # plain steps
            for d in (q // 2, 2 * q):
                gain.observe_step(2e-3 + 5e-4 * q + 1.5e-4 * d, q, d, 3 * q, drafting=q)
    fit = gain.cost.coefficients()
    assert fit.request == pytest.approx(5e-4, rel=0.05) and fit.row == pytest.approx(1.5e-4, rel=0.1)
    assert gain.measured_costs().row == pytest.approx(1.5e-4 * gain.cost.tokens_per_second(), rel=0.1)


def test_unmeasured_speculative_cost_is_fitted_apart_from_rows():
    """Served, a speculative step costs more than the overhead the worker times (the engine
    core's handling of drafts): trees of different sizes and steps without drafts tell it
    from the cost of a row."""
    cost = StepCost(forget=0.01)
    steps = [(1e-3 + 2e-4 * q + 7e-5 * d + (8e-4 + 6e-4 if d else 0.0), q, d, q, 8e-4 if d else 0.0)
             for q, d in _SHAPES]
    _feed(cost, steps)
    fit = cost.coefficients()
    assert fit.row == pytest.approx(7e-5, rel=0.05)
    assert fit.speculative == pytest.approx(8e-4 + 6e-4, rel=0.05)
    assert fit.base == pytest.approx(1e-3, rel=0.1)


def test_overhead_is_known_when_every_step_drafts():
    """A fit cannot split base and overhead without plain steps; the measured overhead can."""
    cost = StepCost()
    _feed(cost, [(3e-3, 1, 8, 3, 1.5e-3), (3.4e-3, 1, 12, 4, 1.5e-3)], repeat=20)
    fit = cost.coefficients()
    assert fit.speculative == pytest.approx(1.5e-3)
    assert fit.row == pytest.approx(1e-4, rel=0.05)
    assert fit.base + fit.request == pytest.approx(7e-4, rel=0.1)     # one request: not told apart
    assert cost.tokens_per_second() == pytest.approx(7 / 6.4e-3, rel=0.01)


def _per_step_reference(steps, forget=0.02):
    """StepCost's sums updated once per step, as it did before it queued steps: the normal
    equations and sums decayed by `1 - forget` per step, the overhead per speculative step."""
    keep = 1.0 - forget
    xtx, xty, sums = np.zeros((4, 4)), np.zeros(4), np.zeros(4)     # sums: seconds, weight, emitted, requests
    overhead = weight = 0.0
    for seconds, requests, rows, emitted, over in steps:
        x = np.array([1.0, requests, rows, 1.0 if rows else 0.0])
        over = min(over, seconds) if rows else 0.0
        xtx = xtx * keep + np.outer(x, x)
        xty = xty * keep + x * (seconds - over)
        sums = sums * keep + np.array([seconds, 1.0, emitted, requests])
        if rows:
            overhead, weight = overhead * keep + over, weight * keep + 1.0
    return xtx, xty, sums, overhead / weight if weight else 0.0


def test_queued_steps_fold_into_the_same_sums_as_a_per_step_update():
    """StepCost folds queued steps when a decision reads the fit (and every 256 steps); the
    decayed sums must be those of one update per step, whenever the fold happens."""
    rng = np.random.default_rng(3)
    steps = [(float(rng.uniform(1e-3, 3e-3)), int(rng.integers(1, 32)), int(rng.choice([0, 0, 0, 12])),
              int(rng.integers(1, 40)), float(rng.uniform(0, 5e-4))) for _ in range(700)]
    cost = StepCost()
    for i, step in enumerate(steps):
        cost.observe(*step)
        if i in (0, 5, 300):                 # reads at odd moments fold what is queued so far
            cost.coefficients()
    cost.coefficients()
    xtx, xty, sums, overhead = _per_step_reference(steps)
    m = cost._moments
    np.testing.assert_allclose(m[:4, :4], xtx, rtol=1e-12)
    np.testing.assert_allclose(m[:4, 4], xty, rtol=1e-12)
    np.testing.assert_allclose([m[0, 5], m[0, 0], m[0, 6], m[0, 1]], sums, rtol=1e-12)
    assert cost._overhead / cost._overhead_weight == pytest.approx(overhead, rel=1e-12)
    assert cost.tokens_per_second() == pytest.approx(sums[2] / sums[0], rel=1e-12)


def test_plain_steps_observed_in_one_call_are_those_steps_observed_one_by_one():
    """`observe_plain` (a quiet stretch's steps, replayed at its end) gives the sums of one
    `observe` per step: one row per request, nothing drafted, as many tokens as requests;
    steps without a positive duration are skipped alike."""
    rng = np.random.default_rng(4)
    one_by_one, batched = StepCost(), StepCost()
    for _ in range(40):
        n = int(rng.integers(1, 32))
        seconds = [float(s) for s in rng.uniform(-1e-4, 3e-3, size=int(rng.integers(0, 30)))]
        for s in seconds:
            one_by_one.observe(s, n, 0, n)
        batched.observe_plain(seconds, n)
        if rng.random() < 0.3:                   # a drafted step between stretches
            step = (float(rng.uniform(1e-3, 3e-3)), n, 12, n + 3, 2e-4)
            one_by_one.observe(*step)
            batched.observe(*step)
    assert batched.steps == one_by_one.steps > 300
    np.testing.assert_allclose(batched.coefficients(), one_by_one.coefficients(), rtol=1e-9)
    np.testing.assert_allclose(batched._moments, one_by_one._moments, rtol=1e-12)


class _Requests(dict):
    """req id -> its GainRecord, made on first use (what the engine's request table keeps)."""

    def __init__(self, gain: GainControl) -> None:
        super().__init__()
        self.gain = gain

    def __missing__(self, req: str) -> GainRecord:
        record = self[req] = self.gain.new_record()
        return record


def _costs(row: float, request: float) -> GainCosts:
    """Fixed costs in tokens, the same fixed cost for greedy and sampled requests."""
    return GainCosts(row, request, request)


def _learn(gain: GainControl, req: GainRecord, depth: int, accepted: int, times: int = 30) -> None:
    for _ in range(times):
        gain.observe_trees([req], [depth], [accepted])


def test_requests_whose_drafts_pay_draft_and_others_stop():
    gain = GainControl(16, probe_every=4)
    reqs = _Requests(gain)
    _learn(gain, reqs["good"], 16, 12)
    _learn(gain, reqs["bad"], 16, 0)
    costs = _costs(0.05, 0.5)           # tokens per verified row, tokens per drafting request
    good = gain.decide(reqs["good"], 16, costs=costs)
    bad = gain.decide(reqs["bad"], 16, costs=costs)
    assert good.nodes >= 12 and not good.probe
    assert bad.nodes == 0


def test_rows_get_dearer_with_load_and_trees_shrink():
    gain = GainControl(16, margin=1.0)
    reqs = _Requests(gain)
    _learn(gain, reqs["r"], 16, 6)
    light = gain.decide(reqs["r"], 16, costs=_costs(0.03, 0.3)).nodes
    heavy = gain.decide(reqs["r"], 16, costs=_costs(0.6, 0.3)).nodes
    assert 0 < heavy < light


def _probe_steps(gain: GainControl, req: GainRecord, steps: int, costs: GainCosts,
                 accepted: int = 0) -> list[int]:
    probes = []
    for step in range(1, steps + 1):
        gain.begin_step()
        d = gain.decide(req, 8, costs=costs)
        if d.nodes:
            assert d.probe and d.nodes == 2
            probes.append(step)
            gain.observe_trees([req], [2], [accepted])
    return probes


def test_stopped_requests_are_probed_with_backoff():
    gain = GainControl(8, probe_every=2, max_probe_every=8, probe_nodes=2)
    reqs = _Requests(gain)
    _learn(gain, reqs["r"], 8, 0)
    probes = _probe_steps(gain, reqs["r"], 60, _costs(0.1, 1.0))
    assert all(p % 2 == 0 for p in probes)                 # on the shared clock
    assert np.diff(probes).tolist()[:4] == [2, 4, 8, 8], probes    # 2 -> 4 -> 8 (capped)


def test_unseeded_requests_probe_in_the_same_steps():
    """One speculative step serves every due probe: its overhead is paid once."""
    gain = GainControl(8, probe_every=4, max_probe_every=16)
    reqs = _Requests(gain)
    for r in ("a", "b", "c"):
        _learn(gain, reqs[r], 8, 0)
    steps = {r: [] for r in ("a", "b", "c")}
    for step in range(1, 80):
        gain.begin_step()
        for r in steps:
            if gain.decide(reqs[r], 8, costs=_costs(0.1, 1.0)).nodes:
                steps[r].append(step)
                gain.observe_trees([reqs[r]], [2], [0])
    assert steps["a"] == steps["b"] == steps["c"] and steps["a"]


def test_a_probe_that_accepts_resumes_drafting():
    gain = GainControl(8, probe_every=1, probe_nodes=2, calibrate_every=0)
    reqs = _Requests(gain)
    _learn(gain, reqs["r"], 8, 0)
    costs = _costs(0.05, 0.3)
    gain.begin_step()
    assert gain.decide(reqs["r"], 8, costs=costs).probe
    for _ in range(5):                                   # the text turned repetitive
        gain.observe_trees([reqs["r"]], [2], [2])
    d = gain.decide(reqs["r"], 8, costs=costs)
    assert d.nodes >= 2 and not d.probe


def test_probes_that_accept_too_little_to_pay_still_back_off():
    gain = GainControl(8, probe_every=2, max_probe_every=16, probe_nodes=2)
    reqs = _Requests(gain)
    _learn(gain, reqs["r"], 8, 0)
    probes = _probe_steps(gain, reqs["r"], 80, _costs(0.2, 1.0), accepted=1)   # one token: not enough
    assert np.diff(probes).tolist()[:4] == [2, 4, 8, 16], probes


def test_seeded_sampled_decisions_ignore_measured_costs():
    """A seeded request's tree (and so its tokens) must not depend on other traffic."""
    gain = GainControl(16, fixed_row_cost=0.05, fixed_request_cost=0.5)
    reqs = _Requests(gain)
    _learn(gain, reqs["s"], 16, 5)
    a = gain.decide(reqs["s"], 16, seeded_sampled=True, costs=_costs(0.01, 0.0))
    b = gain.decide(reqs["s"], 16, seeded_sampled=True, costs=_costs(0.9, 5.0))
    assert a == b and a.nodes > 0


def test_a_requests_state_is_its_record_and_goes_with_it():
    """The controller keeps what is pooled (the class's acceptance); the request's acceptance,
    probe schedule and class are its record, and dropping the record frees them."""
    gain = GainControl(8, probe_every=1)
    r = gain.new_record()
    _learn(gain, r, 8, 0, times=2)
    gain.begin_step()
    assert gain.decide(r, 8, costs=_costs(0.5, 1.0), cls="T0.7").probe
    gain.observe_trees([r], [2], [0])
    assert (r.waited, r.interval, r.probing, r.probed, r.cls) == (0, 2, False, True, "T0.7")
    assert r.acceptance.reached[0] > 0
    assert gain.classes.rates("T0.7") is not None
    gone = weakref.ref(r)
    del r
    gc.collect()
    assert gone() is None


def test_measured_costs_scale_with_the_rate():
    gain = GainControl(8)
    assert gain.measured_costs() == (0.0, 0.0, 0.0)      # nothing measured: draft, then learn
    for _ in range(200):
        gain.observe_step(1e-3, 1, 0, 1)
        for rows in (5, 9):
            gain.observe_step(1.5e-3 + 1e-4 * (rows - 1), 1, rows - 1, 4, drafting=1,
                              drafter_seconds=1e-4, overhead_seconds=5e-4)
    row, request, greedy_request = gain.measured_costs()
    rate = gain.cost.tokens_per_second()
    assert row == pytest.approx(1e-4 * rate, rel=0.1)
    assert greedy_request == pytest.approx(1e-4 * rate, rel=0.01)      # its drafter time
    assert request == pytest.approx((5e-4 + 1e-4) * rate, rel=0.1)     # + the step's overhead


def test_a_greedy_request_is_not_charged_the_steps_overhead():
    """A greedy request whose rows pay keeps its draft however few requests drafted in the
    last speculative step; the step's overhead is checked once, for the whole step (settle).
    Charging each request a share of it (the share of the last step's drafters) stopped more
    requests the fewer drafted. Unseeded sampled requests keep the share."""
    for drafting in (8, 1):
        gain = _costed(1e-3, drafting=drafting)
        reqs = _Requests(gain)
        _learn(gain, reqs["r"], 16, 3)
        costs = gain.measured_costs()
        d = gain.decide(reqs["r"], 16, costs=costs)
        assert d.nodes > 0 and 0 < d.net < gain.margin * gain.step_cost()
        assert not gain.settle([d])                         # alone it cannot pay for the step
        assert gain.settle([d] * 8)                         # eight such drafts can
    _learn(gain, reqs["s"], 16, 3)                          # the last step had one drafter:
    assert gain.decide(reqs["s"], 16, costs=costs, cls="T0.7").nodes == 0     # sampled: charged the share


def test_gain_config_is_checked():
    cfg = load_config({"preset": "prompt-lookup", "budget": {"gain": {"enabled": True}}}, 8)
    assert cfg.budget.gain.enabled
    with pytest.raises(ConfigError, match="budget.gain.max_probe_every"):
        load_config({"preset": "prompt-lookup",
                     "budget": {"gain": {"probe_every": 16, "max_probe_every": 4}}}, 8)
    with pytest.raises(ConfigError, match="budget.gain.enabld"):
        load_config({"preset": "prompt-lookup", "budget": {"gain": {"enabld": True}}}, 8)
    with pytest.raises(ConfigError, match="budget.gain.calibrate_every"):
        load_config({"preset": "prompt-lookup", "budget": {"gain": {"calibrate_every": -1}}}, 8)
    assert load_config({"preset": "prompt-lookup",
                        "budget": {"gain": {"calibrate_every": 0}}}, 8).budget.gain.calibrate_every == 0
    with pytest.raises(ConfigError, match=r"budget.gain.shadow_probes: expected true or false, got 'yes'"):
        load_config({"preset": "prompt-lookup", "budget": {"gain": {"shadow_probes": "yes"}}}, 8)
    assert not load_config({"preset": "prompt-lookup",
                            "budget": {"gain": {"shadow_probes": False}}}, 8).budget.gain.shadow_probes
    with pytest.raises(ConfigError, match=r"budget.gain.guard: expected true or false, got 'off'"):
        load_config({"preset": "prompt-lookup", "budget": {"gain": {"guard": "off"}}}, 8)
    assert load_config({"preset": "prompt-lookup", "budget": {"gain": {}}}, 8).budget.gain.guard


def test_margin_stops_drafts_the_model_rates_break_even():
    plain, careful = GainControl(8, margin=1.0), GainControl(8, margin=2.0)
    records = {g: g.new_record() for g in (plain, careful)}
    for g, r in records.items():
        _learn(g, r, 8, 1)          # about one token accepted per step
    costs = _costs(0.1, 0.45)
    assert plain.decide(records[plain], 8, costs=costs).nodes > 0
    assert careful.decide(records[careful], 8, costs=costs).nodes == 0


def _class_history(gain: GainControl, cls: str, accepted: int, requests: int = 12) -> None:
    """Finished requests of class `cls` whose 8-node drafts accepted `accepted` tokens."""
    for _ in range(requests):
        req = gain.new_record()         # dropped when it finishes: only its class's counts stay
        for _ in range(5):
            gain.begin_step()
            if gain.decide(req, 8, costs=_costs(0.05, 0.3), cls=cls).nodes:
                gain.observe_trees([req], [8], [accepted])


def test_new_requests_start_from_their_class_acceptance():
    """At T=0.7 a new request does not open with a full draft its class never accepts; a
    greedy one (its class accepts) does; a seeded one ignores the class (its own history only)."""
    gain = GainControl(8, probe_every=4)
    reqs = _Requests(gain)
    _class_history(gain, "T0.7", accepted=0)
    _class_history(gain, "greedy", accepted=7)
    costs = _costs(0.05, 0.3)
    assert gain.decide(reqs["new-sampled"], 8, costs=costs, cls="T0.7").nodes == 0
    assert gain.decide(reqs["new-greedy"], 8, costs=costs, cls="greedy").nodes >= 7
    assert gain.decide(reqs["new-seeded"], 8, seeded_sampled=True, costs=costs, cls="T0.7").nodes == 8


def test_a_classes_failed_probes_lengthen_its_new_requests_first_wait():
    """A new request of a class whose probes keep failing starts at the class's long interval;
    one without a class (or whose class probes paid) starts at probe_every."""
    gain = GainControl(8, probe_every=2, max_probe_every=16)
    reqs = _Requests(gain)
    _class_history(gain, "T1.0", accepted=0)
    _learn(gain, reqs["no-class"], 8, 0)        # stopped by its own history, like the class
    costs = _costs(0.2, 1.0)
    probes = {"no-class": 0, "new": 0}
    for _ in range(40):
        gain.begin_step()
        for req, cls in (("no-class", None), ("new", "T1.0")):
            if gain.decide(reqs[req], 8, costs=costs, cls=cls).probe:
                probes[req] += 1
                gain.observe_trees([reqs[req]], [2], [0])
    assert probes["new"] < probes["no-class"], probes
    assert probes["new"] >= 1, probes


def test_calibration_steps_leave_unseeded_requests_undrafted():
    """Every calibrate_every steps unseeded requests draft nothing, so the step cost fit sees
    steps of different sizes; seeded ones decide as always (their trees depend on nothing else)."""
    gain = GainControl(8, calibrate_every=4)
    reqs = _Requests(gain)
    _learn(gain, reqs["g"], 8, 8)
    _learn(gain, reqs["s"], 8, 8)
    drafted = []
    for _ in range(12):
        gain.begin_step()
        drafted.append((gain.decide(reqs["g"], 8, costs=_costs(0.05, 0.3)).nodes,
                        gain.decide(reqs["s"], 8, seeded_sampled=True).nodes))
    assert [g for g, _ in drafted] == [8, 8, 0, 8] * 3
    assert all(s == 8 for _, s in drafted)
    uncalibrated = GainControl(8, calibrate_every=0)
    x = uncalibrated.new_record()
    assert all(uncalibrated.decide(x, 8, costs=_costs(0.0, 0.0)).nodes == 8 for _ in range(3))


def test_decision_kinds_for_metrics():
    from vllm_treespec.budget.gain import GainDecision, decision_kind

    assert decision_kind(GainDecision(4), False) == "draft"
    assert decision_kind(GainDecision(2, probe=True), False) == "probe"
    assert decision_kind(GainDecision(0), False) == "stopped"
    assert decision_kind(GainDecision(0), True) == "calibration"


def test_a_probe_accepted_to_its_end_keeps_probing_soon():
    """A request whose 2-node probes are accepted whole is matching again: it probes at
    probe_every until its acceptance lets it draft, instead of backing off."""
    gain = GainControl(8, probe_every=2, max_probe_every=16, probe_nodes=2, calibrate_every=0)
    reqs = _Requests(gain)
    _learn(gain, reqs["r"], 8, 0)
    probes = _probe_steps(gain, reqs["r"], 40, _costs(0.2, 3.0), accepted=2)     # dear to draft: stays probing
    assert np.diff(probes).tolist()[:4] == [2, 2, 2, 2], probes


def _costed(overhead_s: float, drafting: int) -> GainControl:
    """A controller whose measured speculative-step overhead is `overhead_s` (1 ms plain steps,
    one token per request), learnt from steps in which `drafting` requests drafted."""
    gain = GainControl(16)
    for _ in range(200):
        gain.observe_step(1e-3, 8, 0, 8)
        gain.observe_step(1e-3 + overhead_s, 8, 8, 16, drafting=drafting, overhead_seconds=overhead_s)
    return gain


def test_a_step_is_speculative_only_if_its_drafts_together_pay_for_it():
    """Each request is charged its share of the overhead of the last speculative step (8
    requests drafted): when only one of them would draft now, its gain cannot pay for the
    whole step, and the step stays plain; the same draft from all eight does."""
    from vllm_treespec.budget.gain import GainDecision

    gain = _costed(4e-3, drafting=8)
    whole = gain.step_cost()
    assert whole == pytest.approx(4e-3 * gain.cost.tokens_per_second(), rel=0.05)
    one = GainDecision(4, net=0.6 * whole)
    assert not gain.settle([one, GainDecision(0), GainDecision(0)])
    assert gain.settle([one] * 8)
    assert gain.settle([GainDecision(0)] * 3)                         # nothing drafts: nothing held
    assert gain.settle([one, GainDecision(2, probe=True)])           # a probe makes the step speculative
    assert gain.settle([one, GainDecision(3, net=0.0, own=True)])    # so does a seeded request
    # a shadow probe is verified in no step (budget/shadow.py): it pays for none and is not held
    assert not gain.settle([one, GainDecision(2, probe=True, shadow=True)])
    assert gain.settle([GainDecision(2, probe=True, shadow=True)])


def test_probes_are_shadow_probes_except_for_seeded_requests():
    gain = GainControl(8, probe_every=1, max_probe_every=1, shadow_probes=True, calibrate_every=0)
    reqs = _Requests(gain)
    for r in ("unseeded", "seeded"):
        _learn(gain, reqs[r], 8, 0)
    gain.begin_step()
    unseeded = gain.decide(reqs["unseeded"], 8, costs=_costs(0.1, 1.0))
    seeded = gain.decide(reqs["seeded"], 8, seeded_sampled=True)
    assert unseeded.probe and unseeded.shadow
    assert seeded.probe and not seeded.shadow


def test_held_drafts_leave_the_requests_state_alone():
    gain = _costed(4e-3, drafting=8)
    reqs = _Requests(gain)
    _learn(gain, reqs["r"], 16, 8)
    costs = gain.measured_costs()
    d = gain.decide(reqs["r"], 16, costs=costs)
    assert d.nodes > 0 and d.net > 0 and not d.own
    assert not gain.settle([d])
    assert reqs["r"].waited is None                    # not stopped: it decides again next step
    assert gain.decide(reqs["r"], 16, costs=costs) == d


def test_a_step_of_waiting_requests_does_not_fit_the_costs():
    """The costs (and the step-cost fit's solve behind them) are computed once per step, and
    only when a decision needs them: a step whose requests all wait for their probe skips
    them (most sampled steps), a step that decides computes them once for all its requests."""
    gain = _costed(1e-3, drafting=1)
    reqs = _Requests(gain)
    _learn(gain, reqs["a"], 16, 0)
    _learn(gain, reqs["b"], 16, 0)
    calls = []
    measured = gain.measured_costs
    gain.measured_costs = lambda: calls.append(1) or measured()
    gain.begin_step()
    assert gain.costs_this_step() is None
    assert gain.decide(reqs["a"], 16, cls="T0.7").nodes == 0       # decides: stopped
    assert gain.decide(reqs["b"], 16, cls="T0.7").nodes == 0
    assert len(calls) == 1 and gain.costs_this_step() is not None
    gain.begin_step()                                               # both now wait for a probe
    assert gain.costs_this_step() is None
    assert reqs["a"].waited is not None
    assert gain.decide(reqs["a"], 16, cls="T0.7").nodes == 0
    assert len(calls) == 1 and gain.costs_this_step() is None


def test_solve_small_matches_numpy():
    from vllm_treespec.budget.gain import solve_small

    rng = np.random.default_rng(3)
    for _ in range(50):
        m = rng.normal(size=(4, 4))
        a = m @ m.T + 0.1 * np.eye(4)            # the fit's systems are symmetric positive definite
        a[[0, 2]] = a[[2, 0]]                    # and some need a pivot
        b = rng.normal(size=4)
        assert np.allclose(solve_small(a.tolist(), b.tolist()), np.linalg.solve(a, b))
    with pytest.raises(ValueError, match="singular"):
        solve_small([[0.0, 0.0], [0.0, 0.0]], [1.0, 1.0])


def test_a_held_unseeded_request_sits_out_probe_every_steps():
    """`hold`: an unseeded sampled request whose draft the step could not pay for is not decided
    again for probe_every steps (its acceptance cannot change meanwhile), then decides as
    before; a greedy request is not held over."""
    from vllm_treespec.budget.gain import GainDecision, decision_kind

    gain = _costed(4e-3, drafting=8)
    reqs = _Requests(gain)
    _learn(gain, reqs["s"], 16, 8)
    _learn(gain, reqs["g"], 16, 8)
    costs = gain.measured_costs()
    first = gain.decide(reqs["s"], 16, costs=costs, cls="T0.7")
    assert first.nodes > 0 and not gain.settle([first])
    gain.hold(reqs["s"])
    gain.hold(reqs["g"])
    assert reqs["g"].held_for == 0
    for _ in range(gain.probe_every):
        waiting = gain.decide_without_cap(reqs["s"])
        assert waiting == GainDecision(0, held=True) and decision_kind(waiting, False) == "held"
    assert gain.decide_without_cap(reqs["s"]) is None
    assert gain.decide(reqs["s"], 16, costs=costs, cls="T0.7") == first


def test_a_class_prices_depths_its_drafts_never_reached_like_the_deepest_it_did():
    """2-node probes never reach depth 3: the class's rate there is the one estimated above it,
    not the optimistic constant prior (which made a sampled request's deep nodes look worth
    drafting)."""
    from vllm_treespec.budget.gain import ClassAcceptance

    classes = ClassAcceptance(8, prior=0.8)
    for i in range(300):
        classes.observe("T0.7", 2, i % 3)          # accepted 0, 1, 2 of a 2-node draft
    r = classes.rates("T0.7")
    assert r[0] == pytest.approx(2 / 3, abs=0.03) and r[1] == pytest.approx(1 / 2, abs=0.03)
    assert np.allclose(r[2:], r[1], atol=0.01)
    classes.observe("T0.7", 2, 2)                  # a new observation is seen, not a cached rate
    assert classes.rates("T0.7")[1] > r[1]


def _random_settled(g, rng, n):
    """n (record, seeded_sampled) pairs in states `decide_without_cap` settles: sitting out or
    stopped, with random waits and intervals."""
    out = []
    for _ in range(n):
        r = g.new_record()
        seeded = bool(rng.random() < 0.3)
        if rng.random() < 0.3:
            r.held_for = int(rng.integers(1, 40))
        else:
            r.interval = int(rng.choice([4, 8, 16, 32]))
            r.waited = int(rng.integers(0, r.interval))
        out.append((r, seeded))
    return out


@pytest.mark.parametrize("seed", range(6))
def test_a_quiet_stretch_is_settled_at_once_as_step_by_step(seed):
    """GainControl.settle_quiet_steps (a quiet stretch's catch-up, one update per request)
    leaves every request, the step clock and the counts as the `begin_step` and
    `decide_without_cap` calls of each step would, calibration steps included, for stretches
    as long as `quiet_steps` allows; past that (a probe step within the range, not due) it
    makes the calls themselves, still equal."""
    import copy

    rng = np.random.default_rng(seed)
    for trial in range(40):
        g = GainControl(8, probe_every=4, max_probe_every=32, calibrate_every=8)
        for _ in range(int(rng.integers(0, 50))):
            g.begin_step()
        settled = _random_settled(g, rng, int(rng.integers(0, 6)))
        allowed = min([g.quiet_steps(r, s) for r, s in settled], default=20)
        if trial % 4 == 3:      # unseeded stopped requests whose probe step is in range but not due
            while g._step % 8 != 7:
                g.begin_step()
            for r, s in settled:
                r.held_for, r.waited, r.interval = 0, 0, 8
            settled = [(r, False) for r, s in settled]
            allowed = 8
        steps = int(rng.integers(0, allowed + 1))
        at_once, by_step = copy.deepcopy((g, settled)), copy.deepcopy((g, settled))
        got = at_once[0].settle_quiet_steps(at_once[1], steps)
        want = by_step[0]._settle_quiet_steps_one_by_one(by_step[1], steps)
        assert got == want
        assert at_once[0]._step == by_step[0]._step and at_once[0].calibrating == by_step[0].calibrating
        assert at_once[0].exploring == by_step[0].exploring
        assert [(r.held_for, r.waited) for r, _ in at_once[1]] == [(r.held_for, r.waited) for r, _ in by_step[1]]


@pytest.mark.parametrize("every", [0, 1, 2, 3, 8, 32])
def test_the_clock_skips_a_stretch_as_begin_step_would(every):
    """A quiet stretch moves the probe clock by its length at once: the calibration steps it
    spans (counted, not walked) and the clock's state after it are those of one `begin_step`
    per step."""
    rng = np.random.default_rng(every)
    for _ in range(200):
        at_once, by_step = (GainControl(8, calibrate_every=every) for _ in range(2))
        start = int(rng.integers(0, 200))
        at_once._advance_clock(start)
        for _ in range(start):
            by_step.begin_step()
        steps = int(rng.integers(0, 100))
        calibration = 0
        for _ in range(steps):
            by_step.begin_step()
            calibration += by_step.calibrating
        assert at_once._calibration_steps(start, steps) == calibration
        at_once._advance_clock(steps)
        assert (at_once._step, at_once.calibrating, at_once.exploring) == \
            (by_step._step, by_step.calibrating, by_step.exploring)


def test_quiet_steps_count_the_steps_a_request_is_certainly_settled():
    """GainControl.quiet_steps is what a caller may skip (engine/budget_control.py): sitting
    out, a held request's remaining steps; stopped, the steps before its probe could be due;
    0 for a request that may need a full decision next step. Each count is checked against
    `decide_without_cap` step by step."""
    from vllm_treespec.budget.gain import GainControl

    g = GainControl(8, probe_every=4, max_probe_every=16, calibrate_every=8)
    for _ in range(5):
        g.begin_step()                                   # the clock at step 5
    stopped, seeded, held, free, probed = (g.new_record() for _ in range(5))
    stopped.waited, stopped.interval = 3, 4
    seeded.waited, seeded.interval = 2, 8
    held.held_for = 3
    probed.waited, probed.interval, probed.probed = 1, 4, True
    cases = [(stopped, False, 2), (seeded, True, 5), (held, False, 3), (free, False, 0), (probed, False, 0)]
    assert [g.quiet_steps(r, s) for r, s, _ in cases] == [n for _, _, n in cases]
    for _ in range(5):
        g.begin_step()
        for record, seeded_sampled, n in cases:
            settled = g.decide_without_cap(record, seeded_sampled)
            if n > 0:
                assert settled is not None
                cases = [(r, s, m - 1 if r is record else m) for r, s, m in cases]
