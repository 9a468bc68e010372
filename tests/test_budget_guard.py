"""budget/guard.py: the speculation guard's A/B of drafting at the current load, and how the
engine applies its verdict (engine/budget_control.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from vllm_treespec.budget.guard import SpeculationGuard


def _serve(guard: SpeculationGuard, steps: int, drafted_tps: float, paused_tps: float, requests: int = 8,
           decode: bool = True) -> list[bool]:
    """Run `steps` steps of a server whose drafted steps emit `drafted_tps` tokens per second and
    paused ones `paused_tps` (each step 10 ms); returns whether each step could draft."""
    allowed = []
    for _ in range(steps):
        allows = guard.allows
        allowed.append(allows)
        tokens = (drafted_tps if allows else paused_tps) * 0.01
        guard.step(0.01 if decode else None, round(tokens), requests)
    return allowed


def test_drafting_that_loses_is_paused_until_the_next_test_and_resumes_when_it_gains():
    g = SpeculationGuard(window=4, hold=100, first_test=10, min_steps=4)
    allowed = _serve(g, 10, 800, 1000)
    assert all(allowed) and g.verdict is None                      # no test before first_test
    _serve(g, 33, 800, 1000)                                       # one test of 8 windows of 4
    assert g.tests == 1 and not g.verdict.allows and g.verdict.ratio == pytest.approx(0.8)
    allowed = _serve(g, 100, 800, 1000)
    assert not any(allowed)                                        # paused for the hold
    _serve(g, 33, 2000, 1000)                                      # drafting gains now
    assert g.tests == 2 and g.verdict.allows and g.verdict.ratio == pytest.approx(2.0)
    assert g.allows


def test_windows_alternate_abba_and_each_step_is_counted_for_the_side_it_was_decided_on():
    g = SpeculationGuard(window=2, hold=1000, first_test=0, min_steps=2)
    allowed = _serve(g, 17, 1000, 1000)
    # step 0 is the hold's; the test's 16 steps run ON ON OFF OFF OFF OFF ON ON, twice
    assert allowed[1:17] == [True] * 2 + [False] * 4 + [True] * 4 + [False] * 4 + [True] * 2
    assert g.tests == 1 and g.verdict.ratio == pytest.approx(1.0) and g.verdict.allows


def test_a_small_loss_within_the_margin_keeps_drafting_and_a_clear_gain_is_tested_less_often():
    g = SpeculationGuard(window=4, hold=100, margin=0.05, first_test=0, min_steps=4)
    _serve(g, 33, 970, 1000)
    assert g.verdict.allows                                        # 3% slower: within the margin
    gained = SpeculationGuard(window=4, hold=100, first_test=0, min_steps=4)
    _serve(gained, 33, 3000, 1000)
    allowed = _serve(gained, 399, 3000, 1000)
    assert all(allowed) and gained.tests == 1                      # 4 x 100 steps before the next


def test_without_decode_measurements_a_test_pauses_nothing_beyond_its_own_windows():
    g = SpeculationGuard(window=4, hold=10, first_test=0)
    _serve(g, 33, 100, 1000, decode=False)                       # prompt steps only: not counted
    assert g.tests == 1 and g.verdict is None
    assert all(_serve(g, 10, 100, 1000, decode=False))


def test_a_halved_or_doubled_batch_ends_the_hold():
    g = SpeculationGuard(window=4, hold=1000, first_test=0, min_steps=4)
    _serve(g, 33, 800, 1000, requests=32)
    assert not g.allows
    _serve(g, 5, 800, 1000, requests=24)                          # the same load: still paused
    assert not g.allows and g.tests == 1
    _serve(g, 9, 800, 1000, requests=8)                           # a quarter of it for a while: test again
    assert g.allows                                                # the new test's first window


def _proposer(guard: bool):
    from vllm_treespec.engine.proposer import TreeProposer

    cfg = SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=4),
        additional_config={"treespec": {"drafter": {"type": "prompt_lookup"},
                                        "budget": {"gain": {"enabled": True, "guard": guard}}}},
        model_config=SimpleNamespace(max_model_len=64, tokenizer=None, get_vocab_size=lambda: 4096),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=2048, max_num_seqs=8),
        parallel_config=SimpleNamespace(tensor_parallel_size=1))
    return TreeProposer(cfg)


def test_steady_steps_leave_the_verdict_as_it_is_and_end_where_the_schedule_acts():
    """`steady_steps(n)`: that many steps with n decoding requests leave `allows` unchanged
    whatever they measure, and the step after them is one where the guard's schedule acts (a
    test starts, a window ends); checked from random states, loads and measurements."""
    import copy
    import random

    rng = random.Random(5)
    for trial in range(300):
        g = SpeculationGuard(window=rng.choice([1, 2, 4]), hold=rng.choice([3, 10, 40]),
                             first_test=rng.choice([0, 5, 30]), min_steps=1)
        for _ in range(rng.randrange(0, 150)):               # a random history
            g.step(rng.choice([None, rng.uniform(0.005, 0.02)]), rng.randrange(1, 40), rng.choice([2, 4, 8, 16]))
        n = rng.choice([2, 4, 8, 16])
        k = g.steady_steps(n)
        assert k >= 0
        probe = copy.deepcopy(g)
        before = (probe.allows, probe._test_step >= 0, probe._test_step // probe.window)
        for _ in range(k):
            probe.step(rng.choice([None, rng.uniform(0.005, 0.02)]), rng.randrange(1, 40), n)
            assert probe.allows == before[0]
            assert (probe._test_step >= 0) == before[1]               # no test started or finished
            if before[1]:
                assert probe._test_step // probe.window == before[2]  # ... nor a window ended
        probe.step(0.01, n, n)                                        # the step after them acts
        acted = (probe._test_step >= 0) != before[1] or (before[1] and probe._test_step // probe.window != before[2])
        assert acted, (trial, k)


def test_steady_adds_up_what_one_step_call_each_would():
    """`steady(periods, tokens, n)` (a quiet stretch's steps fed at its end) leaves the guard as
    one `step` call per period would, from random states, in tests and between them; more steps
    than `steady_steps(n)` are refused."""
    import copy
    import random

    rng = random.Random(11)
    fed = 0
    for trial in range(300):
        g = SpeculationGuard(window=rng.choice([1, 2, 4, 8]), hold=rng.choice([3, 10, 40]),
                             first_test=rng.choice([0, 5, 30]), min_steps=1)
        for _ in range(rng.randrange(0, 150)):
            g.step(rng.choice([None, rng.uniform(0.005, 0.02)]), rng.randrange(1, 40), rng.choice([2, 4, 8, 16]))
        n = rng.choice([2, 4, 8, 16])
        steady = g.steady_steps(n)
        k = rng.randrange(0, steady + 1)
        periods = [rng.choice([None, 0.0, rng.uniform(0.005, 0.02)]) for _ in range(k)]
        one_by_one, batched = copy.deepcopy(g), copy.deepcopy(g)
        for p in periods:
            one_by_one.step(p, n, n)
        batched.steady(periods, n, n)
        fed += k
        for name in ("allows", "tests", "_hold_left", "_test_step", "_requests", "_batch_range", "_moved",
                     "_last_allows", "verdict"):
            assert getattr(batched, name) == getattr(one_by_one, name), (trial, name)
        for side in (True, False):
            assert batched._sums[side] == pytest.approx(one_by_one._sums[side], rel=1e-12), trial
        with pytest.raises(ValueError, match="steady"):
            copy.deepcopy(g).steady([0.01] * (steady + 1), n, n)
    assert fed > 1000


def test_a_paused_guard_stops_greedy_and_unseeded_drafts_but_not_seeded_ones():
    import numpy as np
    from vllm import SamplingParams

    from vllm_treespec.budget.gain import GainCosts

    p = _proposer(guard=True)
    p.budget.gain.measured_costs = lambda: GainCosts(row=0.0, request=0.0, greedy_request=0.0)
    ids = ["greedy", "seeded"]
    text = [1, 2, 3, 9, 1, 2, 3]
    buf = np.zeros((8, 64), dtype=np.int32)
    buf[:2, :len(text)] = text
    runner = SimpleNamespace(input_batch=SimpleNamespace(
        req_ids=ids, token_ids_cpu=buf, num_tokens_no_spec=np.array([7, 7] + [0] * 6, dtype=np.int32)))
    runner.requests = {r: SimpleNamespace(sampling_params=SamplingParams(temperature=t, seed=s), output_token_ids=[1])
                       for r, t, s in zip(ids, (0.0, 0.8), (None, 5))}
    sched = SimpleNamespace(num_spec_tokens_to_schedule=0, finished_req_ids=set())
    assert p.propose_step(runner, sched, [[3]] * 2)[0] == [9, 1, 2, 3]      # allowed: the greedy one drafts
    p.budget.guard.allows = False
    drafts = p.propose_step(runner, sched, [[3]] * 2)
    assert drafts[0] == [] and p.requests["seeded"].seeded_sampled
    assert p.budget.step_kind(False, [True, True]) == "paused"
    assert _proposer(guard=False).budget.guard is None


def test_a_test_across_a_changing_load_decides_nothing_and_a_draining_batch_ends_no_hold():
    g = SpeculationGuard(window=4, hold=1000, first_test=0, min_steps=4)
    _serve(g, 16, 800, 1000, requests=32)
    _serve(g, 17, 800, 1000, requests=8)                          # the batch drained mid-test
    assert g.tests == 1 and g.verdict is None and g.allows
    g = SpeculationGuard(window=4, hold=1000, first_test=0, min_steps=4)
    _serve(g, 33, 800, 1000, requests=32)
    _serve(g, 7, 800, 1000, requests=2)                           # a few steps of a draining batch
    assert not g.allows and g.tests == 1


def test_under_tensor_parallelism_every_rank_takes_rank_0s_verdict(monkeypatch):
    """The guard times each rank's own steps; ranks that drafted differently would verify
    different trees, so rank 0's `allows` is broadcast every step."""
    import time

    import vllm_treespec.engine.budget_control as budget_control

    p = _proposer(guard=True)
    p.budget._tensor_parallel = True
    sent = []
    monkeypatch.setattr(budget_control, "_broadcast_from_first_rank", lambda v: sent.append(v) or 0)
    sched = SimpleNamespace(num_scheduled_tokens={"a": 1}, scheduled_spec_decode_tokens={},
                            total_num_scheduled_tokens=1)
    assert p.budget.guard.allows
    p.budget.observe_step(sched, time.perf_counter())
    assert sent == [1] and not p.budget.guard.allows              # rank 0 said paused


def test_the_guard_gauges_are_written_on_change_only():
    """Its gauges (treespec_guard_ratio, treespec_guard_drafting) are written at the first step
    and when the verdict or `allows` changes, not every step (the write is per-step work in
    every idle step of a sampled load)."""
    import time

    p = _proposer(guard=True)
    p.budget.guard = g = SpeculationGuard(window=2, hold=1000, first_test=4, min_steps=1)
    seen, states = [], []
    p.stats.observe_guard = lambda ratio, drafting: seen.append((ratio, drafting))
    sched = SimpleNamespace(num_scheduled_tokens={"a": 1}, scheduled_spec_decode_tokens={},
                            total_num_scheduled_tokens=1)
    for _ in range(30):
        p.budget.observe_step(sched, time.perf_counter())
        state = (g.verdict.ratio if g.verdict is not None else None, g.allows)
        if not states or states[-1] != state:
            states.append(state)
    assert g.tests == 1 and len(states) >= 5        # a whole test ran: its windows and its verdict
    assert seen == states


def test_a_loss_within_the_windows_own_noise_does_not_pause_drafting():
    """Bursty acceptance: drafted windows alternate 8 and 80 tokens. Their pooled rate reads under
    the paused side's, but the windows disagree far more than the loss, so drafting stays; the
    same loss read from windows that agree pauses it."""
    def run(drafted_tokens: list[int]) -> SpeculationGuard:
        g = SpeculationGuard(window=4, hold=100, first_test=0, min_steps=4)
        drafted = iter(drafted_tokens * 8)
        for _ in range(33):
            g.step(0.01, next(drafted) if g.allows else 10, 1)
        return g

    bursty = run([2, 2, 2, 2, 17, 17, 17, 17])       # windows of 8 and 68 tokens: 0.95x pooled
    assert bursty.tests == 1 and bursty.verdict.ratio < 0.96 and bursty.verdict.allows
    steady = run([9, 9, 10, 10])                      # every window 0.95x
    assert steady.tests == 1 and steady.verdict.ratio < 0.96 and not steady.verdict.allows
