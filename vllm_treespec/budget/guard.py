"""The speculation guard: a server-level A/B of drafting itself at the current load.

Why: budget.gain prices each draft from a fitted cost model, and what that model does not see
(drafter calls, rating, tree acceptance beyond the measured part, the engine's handling of drafts)
can make drafting lose although every draft is rated as paying. No cost model fixes what it does
not model; measuring the outcome does. It is a safety net: in the served matrix on the 2-core
CPU (`bench_matrix_guard_ab_code-lm.json`, docs/never-slower.md section 2) it cost nothing measurable, and the one regime that read
under 1 with drafting on (32 greedy clients) turned out to be the benchmark turn's drain, not
drafting.

So the guard measures it. Every so often it runs a test: windows of steps with drafting allowed
and with drafting paused, alternated ON OFF OFF ON (so a drift in the machine's speed hits both
alike), each step's emitted tokens and whole period (from one drafting call to the next:
scheduling, forward, sampling, acceptance, drafting) summed per side. If the drafted side emitted
fewer tokens per second than the paused side by more than `margin`, and by more than the spread
of its own windows says chance could (`NOISE_Z` standard errors of the difference of the two
sides' mean log rate per window), drafting stays paused until the next test, else it stays
allowed. The noise rule is there because acceptance comes in bursts: at one greedy client on
SmolLM2 a window of 8 steps emits 8 or 80 tokens as the request copies or stops copying, and a
test read drafting at 0.96x of paused and paused it for a thousand steps where drafting was
worth more (docs/never-slower.md, "The guard"); at a loaded server the windows agree and a real
loss is still caught. Between tests the verdict holds for `hold` steps, or until
the batch size has stayed halved or doubled since the test for a while (the load that decided
it is gone). A test in which the batch size ranged wider than MAX_BATCH_SPREAD decides nothing
(requests arrived or drained during it, so its sides saw different loads).

Steps with prompt tokens are left out of the sums (their cost is not the decoding's), and so is
a step whose period spans an idle gap (the caller passes None for it: the gap is the traffic's,
not the side's). Seeded
sampled requests are not paused by it (their tokens must not depend on other traffic; the
caller leaves them alone). Pure Python: the caller feeds it each decode step and reads `allows`.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

# a test's windows: True = drafting allowed; ABBA order, twice
_TEST_ORDER = (True, False, False, True, True, False, False, True)
# a test whose decoding batch ranged wider than this factor decides nothing
MAX_BATCH_SPREAD = 1.5
# a loss pauses drafting only when larger than this many standard errors of its estimate
NOISE_Z = 1.64
# drafted windows this much faster than paused ones hold their verdict CLEAR_GAIN_HOLD times longer
CLEAR_GAIN = 1.5
CLEAR_GAIN_HOLD = 4


@dataclass
class GuardVerdict:
    """The last test's outcome."""
    allows: bool              # drafting allowed until the next test
    ratio: float              # drafted windows' tokens per second over paused windows'
    batch: float              # mean decoding requests per step during the test


class SpeculationGuard:
    """See the module docstring. `window`: steps per test window; `hold`: steps a verdict
    holds; `margin`: how much slower (fraction) the drafted side must be to pause drafting;
    `first_test`: steps before the first test (the gain rules learn their costs first);
    `min_steps`: decode steps each side needs for a verdict (else the last verdict stays)."""

    def __init__(self, window: int = 8, hold: int = 1024, margin: float = 0.04, first_test: int = 256,
                 min_steps: int = 12) -> None:
        if window < 1 or hold < 1 or not 0.0 <= margin < 1.0 or first_test < 0 or min_steps < 1:
            raise ValueError("need window >= 1, hold >= 1, 0 <= margin < 1, first_test >= 0, min_steps >= 1")
        self.window, self.hold, self.margin, self.min_steps = int(window), int(hold), float(margin), int(min_steps)
        self.allows = True                  # may requests draft in the step being decided
        self.verdict: GuardVerdict | None = None
        self.tests = 0                      # tests finished
        self._hold_left = int(first_test)   # steps until the next test
        self._test_step = -1                # step within the running test (-1: none running)
        self._windows = [[0.0, 0.0, 0] for _ in _TEST_ORDER]         # test window -> seconds, tokens, steps
        self._requests = 0.0                # decoding requests summed over the test's steps
        self._batch_range = (1 << 30, 0)    # ... their least and most in one step
        self._moved = 0                     # steps in a row at a batch size far from the verdict's
        self._last_allows = True            # what the step being measured was decided under

    def step(self, seconds: float | None, tokens: int, requests: int) -> None:
        """One step has run: `seconds` its whole period and `tokens` what it emitted, with
        `requests` decoding requests (`seconds` None: not a pure decode step, not counted).
        Then decide whether the next step may draft (`allows`)."""
        if self._test_step >= 0 and seconds is not None and seconds > 0 and requests > 0:
            win = self._windows[self._test_step // self.window]      # decided as _TEST_ORDER says
            win[0] += seconds
            win[1] += tokens
            win[2] += 1
            self._requests += requests
            self._batch_range = (min(self._batch_range[0], requests), max(self._batch_range[1], requests))
        elif self._test_step < 0 and self.verdict is not None and requests > 0:
            # the load that decided the verdict is gone once the batch has stayed halved or
            # doubled for a while (not a batch draining for a few steps)
            self._moved = self._moved + 1 if self._load_moved(requests) else 0
            if self._moved >= 2 * self.window:
                self._hold_left = 0
        self._advance()
        self._last_allows = self.allows

    def steady_steps(self, requests: int) -> int:
        """How many following `step` calls with `requests` decoding requests each certainly leave
        `allows` as it is: between tests, those that only count down the hold (and the moved-load
        count); in a test, the rest of the running window. Their seconds and tokens can then be
        fed later, in order, with the same result. Why: a quiet stretch's steps (nobody drafts,
        engine/budget_control.py) need the verdict only where it can change."""
        if self._test_step >= 0:
            return self.window - 1 - self._test_step % self.window
        steps = self._hold_left
        if self.verdict is not None and requests > 0 and self._load_moved(requests):
            steps = min(steps, 2 * self.window - 1 - self._moved)
        return max(steps, 0)

    def steady(self, periods: Sequence[float | None], tokens: int, requests: int) -> None:
        """`step(period, tokens, requests)` for each of `periods` in order, in one update: the
        same state (sums up to float rounding), for at most `steady_steps(requests)` of them, in
        which nothing but the sums and counts moves. Why: a quiet stretch's steps are fed at its
        end (engine/budget_control.py), and one `step` call each was most of that replay."""
        k = len(periods)
        if k > self.steady_steps(requests):
            raise ValueError(f"{k} steps exceed the {self.steady_steps(requests)} steady ones")
        if not k:
            return
        if self._test_step >= 0:
            counted = [p for p in periods if p is not None and p > 0] if requests > 0 else []
            if counted:
                win = self._windows[self._test_step // self.window]
                win[0] += sum(counted)
                win[1] += tokens * len(counted)
                win[2] += len(counted)
                self._requests += requests * len(counted)
                self._batch_range = (min(self._batch_range[0], requests), max(self._batch_range[1], requests))
            self._test_step += k
            return
        if self.verdict is not None and requests > 0:
            self._moved = self._moved + k if self._load_moved(requests) else 0
        self._hold_left -= k

    @property
    def _sums(self) -> dict[bool, list[float]]:
        """Side (drafting allowed or paused) -> [seconds, tokens, steps] of the running or last
        test: its windows' sums by _TEST_ORDER."""
        sums = {True: [0.0, 0.0, 0], False: [0.0, 0.0, 0]}
        for drafted, win in zip(_TEST_ORDER, self._windows):
            side = sums[drafted]
            for i in range(3):
                side[i] += win[i]
        return sums

    def _load_moved(self, requests: int) -> bool:
        """Whether `requests` decoding requests lie at half or double the verdict's batch or
        beyond (the load that decided it may be gone; needs a verdict)."""
        return not 0.5 < requests / max(self.verdict.batch, 1e-9) < 2.0

    def _advance(self) -> None:
        if self._test_step < 0:
            if self._hold_left > 0:
                self._hold_left -= 1
                return
            self._test_step = 0
            self._windows = [[0.0, 0.0, 0] for _ in _TEST_ORDER]
            self._requests = 0.0
            self._batch_range = (1 << 30, 0)
            self._moved = 0
        else:
            self._test_step += 1
        if self._test_step >= self.window * len(_TEST_ORDER):
            self._finish_test()
            return
        self.allows = _TEST_ORDER[self._test_step // self.window]

    def _finish_test(self) -> None:
        self._test_step = -1
        self._hold_left = self.hold
        self.tests += 1
        sums = self._sums
        on, off = sums[True], sums[False]
        low, high = self._batch_range
        if high > MAX_BATCH_SPREAD * low:
            # the load changed during the test (requests arriving or draining): its sides are
            # not comparable; keep the verdict and test again soon
            self._hold_left = self.window * len(_TEST_ORDER)
        elif on[2] >= self.min_steps and off[2] >= self.min_steps and on[0] > 0 and off[0] > 0 and off[1] > 0:
            ratio = (on[1] / on[0]) / (off[1] / off[0])
            allows = ratio >= 1.0 - self.margin or not self._loss_beyond_noise()
            self.verdict = GuardVerdict(allows, ratio, self._requests / (on[2] + off[2]))
            if ratio >= CLEAR_GAIN:
                # a test's paused windows cost what drafting gains: test a clear gain less often
                self._hold_left = CLEAR_GAIN_HOLD * self.hold
        self.allows = self.verdict.allows if self.verdict is not None else True

    def _loss_beyond_noise(self) -> bool:
        """Whether the drafted windows' mean log rate lies below the paused windows' by more than
        NOISE_Z standard errors (Welch's, from the windows' own spread). With fewer than two
        measured windows on a side the spread is unknown and the loss counts as real."""
        sides: dict[bool, list[float]] = {True: [], False: []}
        for drafted, (seconds, tokens, _) in zip(_TEST_ORDER, self._windows):
            if seconds > 0 and tokens > 0:
                sides[drafted].append(math.log(tokens / seconds))
        on, off = sides[True], sides[False]
        if len(on) < 2 or len(off) < 2:
            return True
        diff = statistics.fmean(on) - statistics.fmean(off)
        se = math.sqrt(statistics.variance(on) / len(on) + statistics.variance(off) / len(off))
        return diff + NOISE_Z * se < 0.0
