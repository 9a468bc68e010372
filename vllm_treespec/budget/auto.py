"""Auto budgets (`budget.mode: auto`): pick the budget that maximises predicted tokens per second.

Why online: the best budget depends on the hardware (verify cost per query token), the drafter and
the traffic (how many drafted tokens are accepted), and the last two drift while serving. The
policy keeps three small models and picks, for a step of B requests,

    argmax_b  B * (1 + E[accepted | b]) / (cost(B * (1 + fill(b) * b)) + B * draft(b))

(b = 0: B / cost(B), plain decoding) over the configured candidate budgets, where cost is the
target's step seconds for a number of query tokens (`CostModel`), E[accepted | b] the accepted
draft tokens per request-step at budget b, fill(b) the share of the budget the drafter actually
fills, draft(b) drafter + builder seconds per drafting request. Hysteresis (margin and patience,
per batch-size bucket) keeps one noisy step from flipping the choice; a deterministic exploration
schedule tries a neighbouring budget now and then so estimates of unchosen budgets stay fresh.
Everything is deterministic (no random numbers): the same observations give the same choices.
"""
from __future__ import annotations

import bisect
import dataclasses
import math
from typing import Any, Iterable, Sequence

from vllm_treespec.budget.base import BudgetChoice, BudgetPolicy


def _pav(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """Weighted isotonic (non-decreasing) fit by pool-adjacent-violators: noise must not make a
    larger query or budget look cheaper or less accepted than a smaller one."""
    blocks: list[list[float]] = []   # [mean, weight, count]
    for v, w in zip(values, weights):
        blocks.append([float(v), max(float(w), 1e-12), 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            m2, w2, n2 = blocks.pop()
            m1, w1, n1 = blocks[-1]
            blocks[-1] = [(m1 * w1 + m2 * w2) / (w1 + w2), w1 + w2, n1 + n2]
    return [m for m, _, n in blocks for _ in range(int(n))]


class Average:
    """A mean that starts as a running mean over `prior_weight` pseudo-observations of `prior`
    and turns into an exponential moving average with weight `ema` per observation once the
    running mean would weigh a new observation less than `ema` (so early estimates are not
    dominated by the first sample, and late ones follow drift)."""

    def __init__(self, prior: float = 0.0, prior_weight: float = 0.0, ema: float = 0.1) -> None:
        self.value = float(prior)
        self.prior_weight = float(prior_weight)
        self.ema = float(ema)
        self.count = 0

    def add(self, mean: float, count: int = 1) -> None:
        """Fold in `count` observations whose mean is `mean`."""
        if count <= 0:
            return
        running = count / (self.prior_weight + self.count + count)
        decayed = 1.0 - (1.0 - self.ema) ** count
        self.value += max(running, decayed) * (float(mean) - self.value)
        self.count += count


class CostModel:
    """Target step seconds as a function of the step's query tokens.

    Seeded with profile points (query_tokens, seconds); observed steps refine it: each power-of-two
    bucket of query tokens keeps an `Average` of the observed query tokens and seconds, and once a
    bucket has an observation its centroid replaces the profile points inside that bucket. The
    curve through the points is made non-decreasing (weighted isotonic fit; a bucket's centroid
    weighs as many profile points as it has observations), interpolated linearly, extrapolated linearly
    past the last point (slope of the last rising segment) and flat below the first.
    `__call__` returns None until two distinct query counts are known.
    """

    def __init__(self, profile: Iterable[Sequence[float]] = (), ema: float = 0.1) -> None:
        self.ema = ema
        self.buckets: dict[int, tuple[Average, Average]] = {}
        self.seed(profile)

    def seed(self, profile: Iterable[Sequence[float]]) -> None:
        """Replace the profile points (e.g. with the engine's startup measurement); observed
        steps keep precedence within their buckets."""
        points = sorted((float(q), float(s)) for q, s in profile)
        for q, s in points:
            if q < 1 or s <= 0 or not math.isfinite(s):
                raise ValueError(f"profile point ({q}, {s}): need query_tokens >= 1 and seconds > 0")
        self.profile = points
        self._curve: tuple[list[float], list[float]] | None = None

    @staticmethod
    def bucket(query_tokens: float) -> int:
        return max(1, int(query_tokens)).bit_length()

    def observe(self, query_tokens: int, seconds: float) -> None:
        if query_tokens < 1 or not seconds > 0 or not math.isfinite(seconds):
            return
        q_avg, s_avg = self.buckets.setdefault(self.bucket(query_tokens),
                                               (Average(ema=self.ema), Average(ema=self.ema)))
        q_avg.add(query_tokens)
        s_avg.add(seconds)
        self._curve = None

    def points(self) -> tuple[list[float], list[float]]:
        """The (query_tokens, seconds) knots of the current curve (non-decreasing seconds)."""
        if self._curve is None:
            pts: dict[float, list[tuple[float, float]]] = {}   # q -> [(seconds, weight)]
            for q, s in self.profile:
                if self.bucket(q) not in self.buckets:
                    pts.setdefault(q, []).append((s, 1.0))
            for q_avg, s_avg in self.buckets.values():   # weighs as many profile points as steps seen
                pts.setdefault(q_avg.value, []).append((s_avg.value, float(s_avg.count)))
            qs = sorted(pts)
            ws = [sum(w for _, w in pts[q]) for q in qs]
            ss = _pav([sum(s * w for s, w in pts[q]) / w_q for q, w_q in zip(qs, ws)], ws)
            self._curve = (qs, ss)
        return self._curve

    @property
    def ready(self) -> bool:
        return len(self.points()[0]) >= 2

    def __call__(self, query_tokens: float) -> float | None:
        qs, ss = self.points()
        if len(qs) < 2:
            return None
        q = float(query_tokens)
        if q <= qs[0]:
            return ss[0]
        i = bisect.bisect_left(qs, q)                      # qs[i-1] < q <= qs[i]
        if i < len(qs):
            return ss[i - 1] + (ss[i] - ss[i - 1]) * (q - qs[i - 1]) / (qs[i] - qs[i - 1])
        # Past the end: the last rising segment's slope (pooling may have flattened the last one;
        # a flat tail would make huge steps look free).
        j = len(qs) - 1
        while j > 1 and ss[j] == ss[j - 1]:
            j -= 1
        slope = (ss[j] - ss[j - 1]) / (qs[j] - qs[j - 1])
        return ss[-1] + slope * (q - qs[-1])


@dataclasses.dataclass
class _Bucket:
    """Hysteresis state of one batch-size bucket."""
    current: int | None = None
    streak: int = 0          # consecutive decisions in which some candidate beat `current` by the margin
    decisions: int = 0
    switches: int = 0
    explore_up: bool = True  # next exploration tries the larger neighbour first


class AutoBudget(BudgetPolicy):
    """See the module docstring. `candidates` are node budgets (0 = plain decoding); `profile`
    seeds the cost model; `margin`/`patience` are the hysteresis, `explore_every` the exploration
    period in decisions per batch-size bucket (0 = off); `ema` weighs new step observations (cost,
    drafter time, fill), `accept_ema` new request-step acceptance observations; the acceptance
    prior for budget b is min(b, prior_gain * log2(1 + b)) with `prior_weight` pseudo-observations.
    Before the cost model knows two points it returns the smallest non-zero candidate (cheap to
    verify, and it drafts so acceptance gets measured)."""
    mode = "auto"
    learns = True

    def __init__(self, candidates: Sequence[int], *, profile: Iterable[Sequence[float]] = (),
                 margin: float = 0.05, patience: int = 3, explore_every: int = 0,
                 ema: float = 0.1, accept_ema: float = 0.02, prior_gain: float = 0.75,
                 prior_weight: float = 8.0) -> None:
        cands = sorted(set(int(c) for c in candidates))
        if not cands or cands[0] < 0:
            raise ValueError(f"candidates must be non-empty budgets >= 0, got {list(candidates)}")
        if margin < 0 or patience < 1 or explore_every < 0:
            raise ValueError("need margin >= 0, patience >= 1, explore_every >= 0")
        super().__init__(cands[-1])
        self.candidates = cands
        self.margin, self.patience, self.explore_every = float(margin), int(patience), int(explore_every)
        self.cost = CostModel(profile, ema=ema)
        self.accept = {b: Average(self.prior_accepted(b, prior_gain), prior_weight, accept_ema)
                       for b in cands}
        self.fill = {b: Average(1.0, 0.0, ema) for b in cands}
        self.draft = {b: Average(0.0, 0.0, ema) for b in cands}
        self.buckets: dict[int, _Bucket] = {}
        nonzero = [c for c in cands if c > 0]
        self.fallback = nonzero[0] if nonzero else 0

    @staticmethod
    def prior_accepted(budget: int, gain: float) -> float:
        """Prior accepted tokens per request-step: grows like log(budget), never above budget."""
        return min(float(budget), gain * math.log2(1 + budget))

    # -- the models ----------------------------------------------------------------------
    def _nearest(self, budget: int) -> int:
        i = bisect.bisect_left(self.candidates, budget)
        if i == len(self.candidates):
            return self.candidates[-1]
        if i == 0 or self.candidates[i] == budget:
            return self.candidates[i]
        lo, hi = self.candidates[i - 1], self.candidates[i]
        return lo if budget - lo <= hi - budget else hi

    def estimates(self) -> dict[int, dict[str, float]]:
        """Per candidate: expected accepted tokens (non-decreasing in the budget, at most the
        budget), fill share and drafter seconds per request (non-decreasing)."""
        cands = self.candidates
        acc = _pav([self.accept[b].value for b in cands],
                   [self.accept[b].prior_weight + self.accept[b].count for b in cands])
        out, draft_so_far = {}, 0.0
        for b, a in zip(cands, acc):
            if self.draft[b].count:
                draft_so_far = max(draft_so_far, self.draft[b].value)
            out[b] = {"accepted": 0.0 if b == 0 else min(max(a, 0.0), float(b)),
                      "fill": min(max(self.fill[b].value, 0.0), 1.0),
                      "draft_seconds": 0.0 if b == 0 else draft_so_far}
        return out

    def predicted_rates(self, batch_size: int) -> dict[int, float] | None:
        """Predicted tokens/second of each candidate at this batch size (None: cost unknown)."""
        if not self.cost.ready:
            return None
        B = max(1, int(batch_size))
        rates = {}
        for b, e in self.estimates().items():
            seconds = self.cost(B * (1 + e["fill"] * b)) + B * e["draft_seconds"]
            rates[b] = B * (1 + e["accepted"]) / max(seconds, 1e-12)
        return rates

    # -- the policy ----------------------------------------------------------------------
    @staticmethod
    def batch_bucket(batch_size: int) -> int:
        """Power-of-two buckets (1, 2-3, 4-7, ...): each keeps its own current choice."""
        return max(1, int(batch_size)).bit_length()

    def choose(self, batch_size: int, context_len: int = 0) -> BudgetChoice:
        """context_len is not used by this policy (its cost model is per query token)."""
        st = self.buckets.setdefault(self.batch_bucket(batch_size), _Bucket())
        st.decisions += 1
        rates = self.predicted_rates(batch_size)
        if rates is None:
            return BudgetChoice(self.fallback)
        best = max(self.candidates, key=lambda b: (rates[b], -b))   # ties: the smaller budget
        if st.current is None:
            st.current = best
        elif best != st.current and rates[best] > rates[st.current] * (1 + self.margin):
            st.streak += 1
            if st.streak >= self.patience:
                st.current, st.streak = best, 0
                st.switches += 1
        else:
            st.streak = 0
        if self.explore_every and st.decisions % self.explore_every == 0:
            other = self._neighbour(st)
            if other is not None:
                return BudgetChoice(other, explored=True)
        return BudgetChoice(st.current)

    def _neighbour(self, st: _Bucket) -> int | None:
        """Alternately the next larger and next smaller candidate (the other one at the ends)."""
        i = self.candidates.index(st.current)
        up = self.candidates[i + 1] if i + 1 < len(self.candidates) else None
        down = self.candidates[i - 1] if i > 0 else None
        pick = (up if up is not None else down) if st.explore_up else (down if down is not None else up)
        st.explore_up = not st.explore_up
        return pick

    def observe(self, *, query_tokens: int, step_seconds: float, budgets: Sequence[int],
                accepted: Sequence[int], drafted: Sequence[int] | None = None,
                drafter_seconds: float = 0.0) -> None:
        if len(accepted) != len(budgets) or drafted is not None and len(drafted) != len(budgets):
            raise ValueError("budgets, accepted and drafted need one entry per request")
        self.cost.observe(query_tokens, step_seconds)
        per: dict[int, list[int]] = {}
        for b, a in zip(budgets, accepted):
            if b > 0:
                per.setdefault(self._nearest(int(b)), []).append(int(a))
        for cand, accs in per.items():
            self.accept[cand].add(sum(accs) / len(accs), len(accs))
        drafting = [i for i, b in enumerate(budgets) if b > 0]
        if not drafting:
            return
        step_budget = self._nearest(max(int(b) for b in budgets))
        if step_budget == 0:
            return
        nominal = sum(int(budgets[i]) for i in drafting)
        actual = nominal if drafted is None else sum(min(int(drafted[i]), int(budgets[i])) for i in drafting)
        self.fill[step_budget].add(actual / nominal)
        if drafter_seconds > 0:
            self.draft[step_budget].add(drafter_seconds / len(drafting))

    def state(self) -> dict[str, Any]:
        return {**super().state(), "candidates": list(self.candidates),
                "current": {f"batch {1 << (k - 1)}-{(1 << k) - 1}": st.current
                            for k, st in sorted(self.buckets.items())},
                "estimates": self.estimates(),
                "profile": [list(p) for p in self.cost.profile],
                "cost_points": [list(p) for p in zip(*self.cost.points())]}
