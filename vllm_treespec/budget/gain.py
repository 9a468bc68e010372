"""Per-request gain control (`budget.gain`): each request drafts only the nodes that pay.

Why: one budget cannot fit all traffic. A greedy request on repetitive code accepts 6-7 tokens per
step from 32-deep chains; a sampled one accepts 1-2 from the same chains; at 32 clients on a
compute-bound CPU every verified row slows the whole batch. A node is worth drafting when the
tokens it is expected to add exceed the tokens its verification costs the batch; a request is
worth drafting at all when its nodes' net gain exceeds the fixed cost of a speculative step
(drafting, spec-decode metadata, tree acceptance). Requests whose drafts do not pay stop drafting
(no rows, no drafter call; a step where nobody drafts is a plain step, runner_patches) and are
probed again now and then with a small draft, on a schedule that backs off while probes are
not accepted whole. The probes of requests that are not seeded are shadow probes
(budget/shadow.py): drafted but not verified, settled by the tokens the request samples next,
so a probe costs a drafter call and no speculative step.

Per request, step and candidate depth d the controller compares
    reach(d)                                      P(the request accepts through depth d), its own
                                                  decayed acceptance by depth (budget/reach.py)
    row_cost = row_seconds * tokens_per_second    tokens the batch loses per extra verified row
and drafts n = the deepest d with reach(d) >= row_cost, if
    sum(reach[:n]) - n * row_cost > request_cost  (drafter seconds, in tokens; for sampled
                                                  requests also a share of the spec-step overhead)
The speculative step's overhead (spec-decode metadata, tree acceptance for every request in it) is
one cost for the whole step: the step goes speculative only if its drafts' summed net gain
exceeds it (`settle`), otherwise they are held and the step is plain (a held unseeded sampled
request then sits out a few steps: `hold`). A greedy request's decision
prices only its own rows and drafter time. Charging it a share of the overhead as well (the share
of the last speculative step's drafters) fed on itself: when few drafted, each was charged more,
so fewer drafted, and served at 8 greedy clients 80% of decisions were `stopped`
(docs/never-slower.md section 2). Unseeded sampled requests keep that share in their own cost:
on this CPU drafting them more has measured as losing, and whether the joint rule alone would
lose for them is not measured.
where row_seconds, the speculative step's overhead and tokens_per_second are measured online from
decode steps (`StepCost`: step seconds = base + request_seconds * requests + row_seconds *
draft_rows, fitted by exponentially weighted least squares, plus the overhead the engine times in
every speculative step). As the
batch grows the rate grows and so does the row cost, so trees shrink with load; on hardware where
rows are nearly free they grow.

New requests: an unseeded sampled request starts from its class's pooled acceptance by depth
(`ClassAcceptance`: the temperature to one decimal), not from an optimistic constant:
at temperature 0.7 a new request's 12-node first drafts lose, and with 128-token answers those
first steps are a large share of its life. A stopped request's first probe interval is its
class's: it doubles when a probe of the class does not turn into drafting and halves when one
does, so under sampled traffic that does not pay, new requests probe rarely from the start.

Confidence mode (`budget.gain.confidence`, greedy requests; budget/confidence.py): instead of
deciding before drafting, the request drafts every step and `decide_rated` keeps the prefix of its
tree whose nodes pay for their rows, each node scored by the larger of its drafter's rating and
the request's own reach at its depth (`node_scores`), that score calibrated on what was
accepted; no stopped state, no probes. The step is then settled as above.

Seeded sampled requests: their tokens depend on their tree shapes (the coins of verify/coins.py
sample whichever nodes exist), so their decisions use only their own history and the fixed costs
`fixed_row_cost` / `fixed_request_cost` from the config, never the measured batch costs: a seeded
request samples the same tokens whatever else the server runs. Greedy requests' tokens never
depend on their trees, and unseeded sampled requests promise only the distribution.

Pure Python and numpy: no vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from vllm_treespec.budget.confidence import keep_prefixes
from vllm_treespec.budget.reach import SAMPLED, ReachCap, ReachRecord, observe_depths

__all__ = ["ClassAcceptance", "GAIN_DECISIONS", "GainControl", "GainCosts", "GainDecision", "GainRecord",
           "StepCoefficients", "StepCost", "decision_kind", "gain_class"]


def gain_class(temperature: float | None) -> str | None:
    """An unseeded sampled request's class for pooled acceptance: its temperature to one decimal
    ("T0.7"; acceptance of the same drafts falls steeply with temperature, far less with the
    filters). None for greedy requests: they keep the optimistic prior, because how much of a
    greedy draft is accepted depends on the request's own text (prompt lookup on a repetitive
    file vs prose), a wrong first draft costs them only its rows, and a pooled prior held
    repetitive requests back for a probe interval (greedy at one client: 1.28x with it, 1.50x
    without, docs/never-slower.md section 2)."""
    if ReachCap.sampling_class(temperature) != SAMPLED:
        return None
    return f"T{float(temperature):.1f}"


class StepCoefficients(NamedTuple):
    """StepCost's fit of a decode step, in seconds (each >= 0)."""
    base: float          # per step
    request: float       # per decoding request (its own row, sampling, the engine's per-request work)
    row: float           # per verified draft row
    speculative: float   # per speculative step: the measured overhead plus the fitted rest


class StepCost:
    """The cost side of a decode step, learnt online (weight `forget` per new step):

    - the step's seconds, less the overhead the engine measured in it, as
      base + request_seconds * requests + row_seconds * draft_rows + extra * [speculative],
      fitted by exponentially weighted least squares over decode steps. A request's own row and
      a verified draft row are priced apart: served, each request also costs its step the
      engine's per-request work (scheduling, output handling, sampling), which a draft row does
      not add, and when the two were one slope (fitted mostly on plain steps of varying batch)
      it priced a draft row at 32 greedy clients near the whole per-request cost, so most
      drafts were cut (docs/never-slower.md section 2). `extra` is what a speculative step costs
      beyond the measured overhead and its rows (served: the engine core's handling of drafts);
      it is told apart from the rows by trees of different sizes and from the base by steps
      without drafts (budget.gain's calibration steps). Ridge terms of `prior_weight`
      pseudo-steps hold the request slope at 3% of the mean step, the draft-row slope at the
      request slope and `extra` at 0 until the data say otherwise;
    - the measured overhead (spec-decode planning, tree acceptance, tree attention; timed by the
      engine in every speculative step, not fitted);
    - the tokens the recent decode steps emitted per second.
    """

    def __init__(self, forget: float = 0.02, prior_weight: float = 1.0) -> None:
        if not 0.0 < forget < 1.0 or prior_weight <= 0:
            raise ValueError("need 0 < forget < 1 and prior_weight > 0")
        self.forget, self.prior_weight = float(forget), float(prior_weight)
        # decayed sums of the products of each step's terms (`_TERMS`: 1, requests, draft
        # rows, speculative, seconds less overhead, seconds, emitted tokens): the fit's normal
        # equations and the means of its prior, in one matrix. Steps are queued and folded in
        # when a decision reads the fit (`_fold`, one matrix product): most idle sampled steps
        # decide nothing, and an update per step was a measurable part of the proposer's step
        # (`bench_paired_c1_off_vs_default_t07_unseen_moments{,_run2}_code-lm.json`)
        self._moments = np.zeros((len(_TERMS), len(_TERMS)))
        self._queued: list[tuple[float, ...]] = []      # each step's terms
        self._overhead = 0.0         # decayed (per speculative step) measured overhead, its weight
        self._overhead_weight = 0.0
        self.steps = 0
        self._fit: StepCoefficients | None = None

    def observe(self, seconds: float, requests: int, draft_rows: int, emitted: int,
                overhead_seconds: float = 0.0) -> None:
        """One decode step (no prompt tokens): its seconds, decoding requests, verified draft
        rows (> 0: a speculative step), the tokens it emitted and (speculative steps) its
        measured overhead seconds."""
        if not seconds > 0 or requests < 1 or draft_rows < 0:
            return
        overhead = 0.0
        if draft_rows > 0:
            overhead = min(max(float(overhead_seconds), 0.0), seconds)
            # the overhead's average decays by speculative steps only (it is measured in those)
            keep = 1.0 - self.forget
            self._overhead = self._overhead * keep + overhead
            self._overhead_weight = self._overhead_weight * keep + 1.0
        self._queue([(1.0, float(requests), float(draft_rows), 1.0 if draft_rows > 0 else 0.0,
                      seconds - overhead, float(seconds), float(emitted))])

    def observe_plain(self, seconds: Sequence[float], requests: int) -> None:
        """`observe(s, requests, 0, requests)` for each of `seconds` in order, in one call: decode
        steps of one row per request, nothing drafted (a quiet stretch's, replayed at its end)."""
        if requests < 1:
            return
        r = float(requests)
        steps = [(1.0, r, 0.0, 0.0, s, s, r) for s in seconds if s > 0]
        if steps:
            self._queue(steps)

    def _queue(self, steps: list[tuple[float, ...]]) -> None:
        """Queue observed steps' terms (`_TERMS`), folded when a decision reads the fit or the
        queue is long."""
        self._queued.extend(steps)
        self.steps += len(steps)
        self._fit = None
        if len(self._queued) >= _FOLD_EVERY:
            self._fold()

    def _fold(self) -> None:
        """Fold the queued steps into the decayed moments, oldest first: the same sums as one
        update per step (each step's weight is keep ** (steps observed after it))."""
        if not self._queued:
            return
        terms = np.array(self._queued)                                    # [n, len(_TERMS)]
        self._queued.clear()
        keep = 1.0 - self.forget
        n = terms.shape[0]
        w = keep ** np.arange(n - 1, -1, -1, dtype=np.float64)           # [n] newest weighs 1
        self._moments = self._moments * keep ** n + terms.T @ (terms * w[:, None])

    @property
    def ready(self) -> bool:
        return self.steps > 0

    def tokens_per_second(self) -> float:
        """Tokens the recent decode steps emitted per second of step time."""
        self._fold()
        seconds, tokens = float(self._moments[0, 5]), float(self._moments[0, 6])
        return tokens / seconds if seconds > 0 else 0.0

    def coefficients(self) -> StepCoefficients:
        """The fit (all 0 before the first step)."""
        if self._fit is None:
            if not self.ready:
                return StepCoefficients(0.0, 0.0, 0.0, 0.0)
            self._fold()
            m = self._moments.tolist()
            weight, requests, draft_rows, seconds = m[0][0], m[0][1], m[0][2], m[0][5]
            mean_step = seconds / weight
            mean_requests = max(requests / weight, 1.0)
            mean_draft_rows = max(draft_rows / weight, 1.0)
            prior = (0.0, 0.03 * mean_step, 0.0, 0.0)
            scale = [self.prior_weight * w for w in (1e-6, mean_requests ** 2, 0.0, 1.0)]
            a = [row[:4] for row in m[:4]]
            for i in range(4):
                a[i][i] += scale[i]
            # a draft row's slope is pulled toward a request's, not toward a constant: until
            # verified drafts say otherwise a draft row costs what a request's row costs (the
            # single slope this fit had), so a server that has drafted nothing yet prices rows
            # from the batch sizes it has seen rather than from a guess it can never revise
            # (weak: with no draft rows seen any weight makes them equal, with some it should not bias)
            tie = 0.05 * self.prior_weight * mean_draft_rows ** 2
            a[1][1] += tie
            a[2][2] += tie
            a[1][2] -= tie
            a[2][1] -= tie
            fit = solve_small(a, [b + w * m for b, w, m in zip([row[4] for row in m[:4]], scale, prior)])
            overhead = self._overhead / self._overhead_weight if self._overhead_weight else 0.0
            self._fit = StepCoefficients(max(fit[0], 0.0), max(fit[1], 0.0), max(fit[2], 0.0),
                                         overhead + max(fit[3], 0.0))
        return self._fit


# StepCost folds its queued steps at least this often (bounded memory when nothing reads the fit)
_FOLD_EVERY = 256
# a step's terms in StepCost's moments: the fit's regressors (0-3) and target (4), then what the
# prior and the rate need (5, 6); products with term 0 are plain decayed sums
_TERMS = ("one", "requests", "draft_rows", "speculative", "seconds_less_overhead", "seconds", "emitted")


def solve_small(a: list[list[float]], b: list[float]) -> list[float]:
    """x with a x = b for a small dense system (Gaussian elimination with partial pivoting, in
    place on the copies given): the step-cost fit's 4x4 normal equations, solved without
    numpy's per-call overhead."""
    n = len(b)
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        if a[pivot][col] == 0.0:
            raise ValueError("singular system")
        if pivot != col:
            a[col], a[pivot] = a[pivot], a[col]
            b[col], b[pivot] = b[pivot], b[col]
        inv = 1.0 / a[col][col]
        for r in range(col + 1, n):
            f = a[r][col] * inv
            if f:
                row, top = a[r], a[col]
                for c in range(col, n):
                    row[c] -= f * top[c]
                b[r] -= f * b[col]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (b[r] - sum(a[r][c] * x[c] for c in range(r + 1, n))) / a[r][r]
    return x


class ClassAcceptance:
    """Conditional acceptance by depth pooled over the unseeded requests of each sampling class
    (decayed counts, weight `decay` lost per observation): the prior of the class's new requests.
    `prior` / `prior_weight`: what is assumed at depths the class has not been observed at."""

    def __init__(self, max_depth: int, prior: float = 0.8, prior_weight: float = 1.0,
                 decay: float = 0.01) -> None:
        if max_depth < 1 or not 0.0 < prior <= 1.0 or prior_weight <= 0 or not 0.0 <= decay < 1.0:
            raise ValueError("need max_depth >= 1, 0 < prior <= 1, prior_weight > 0, 0 <= decay < 1")
        self.max_depth, self.prior, self.prior_weight, self.decay = int(max_depth), float(prior), \
            float(prior_weight), float(decay)
        self._counts: dict[str, tuple[np.ndarray, np.ndarray]] = {}   # class -> (reached, accepted)
        self._rates: dict[str, np.ndarray] = {}       # class -> rates(), until its next observation

    def observe(self, cls: str, depth: int, accepted: int) -> None:
        """One verified draft of a request of class `cls`: its deepest node and accepted length
        (a class gets counts with its first draft that has nodes)."""
        counts = self._counts.get(cls)
        if counts is None:
            counts = (np.zeros(self.max_depth), np.zeros(self.max_depth))
        if observe_depths(*counts, self.decay, depth, accepted):
            self._counts[cls] = counts
            self._rates.pop(cls, None)

    def rates(self, cls: str) -> np.ndarray | None:
        """float [max_depth] conditional acceptance at each depth; None before any observation.
        A depth's prior is the rate estimated at the depth above it (the first depth's is
        `prior`): depths the class's drafts rarely reach (a 2-node probe never reaches depth 3)
        are assumed to accept like the deepest ones observed, not at an optimistic constant,
        which would price a sampled request's deep nodes far above what they return."""
        counts = self._counts.get(cls)
        if counts is None:
            return None
        cached = self._rates.get(cls)
        if cached is None:
            reached, hit = counts
            w = self.prior_weight
            cached = np.empty(self.max_depth)
            prior = self.prior
            for d in range(self.max_depth):
                prior = cached[d] = (hit[d] + prior * w) / (reached[d] + w)
            self._rates[cls] = cached
        return cached


@dataclass(eq=False)
class GainRecord:
    """One request's gain-control state. It lives in the request's own record
    (engine/request_table.py) and is freed with it: `GainControl` keeps only pooled state (the
    step cost, the shared probe clock, each class's acceptance and first probe interval)."""
    acceptance: ReachRecord          # its decayed acceptance by depth (under GainControl.reach's settings)
    waited: int | None = None        # stopped: steps since its last probe (None: not stopped)
    interval: int | None = None      # stopped: its current probe interval in steps (None: not stopped)
    probing: bool = False            # its last draft was a probe not yet verified
    probed: bool = False             # a probe of it was verified; its next decision judges it
    cls: str | None = None           # unseeded: its sampling class (its drafts feed the class's counts)
    held_for: int = 0                # unseeded, its draft held back (`GainControl.hold`): steps it still sits out


class GainCosts(NamedTuple):
    """A step's measured costs in tokens, before the margin (`GainControl.measured_costs`)."""
    row: float                          # one extra verified row
    request: float                      # an unseeded sampled request's fixed cost: its drafter
                                        # time and its share of the speculative step's overhead
    greedy_request: float               # a greedy request's: its drafter time


@dataclass(frozen=True)
class GainDecision:
    nodes: int
    probe: bool = False
    net: float = 0.0          # a draft that pays: its expected tokens minus its rows' cost (tokens)
    own: bool = False         # decided on the request's own history alone (seeded sampled)
    explore: bool = False     # kept by an exploration step, whatever rows cost (`begin_step`)
    held: bool = False        # sitting out the steps after its draft was held back (`GainControl.hold`)
    shadow: bool = False      # a probe checked against the tokens the request samples next, not
                              # verified: it never makes the step speculative (budget/shadow.py)


GAIN_DECISIONS = ("draft", "probe", "stopped", "calibration", "held", "declined", "explore")

# The decisions that carry nothing but their kind, made once (frozen, so shared): most requests of
# a sampled batch get one of them every step, and a dataclass instance per request and step was a
# measurable part of an idle step at 32 clients.
NO_DRAFT = GainDecision(0)
SITTING_OUT = GainDecision(0, held=True)

# An exploration step keeps a rated node whose calibrated worth is at least this (tokens).
EXPLORE_WORTH = 0.5


def decision_kind(decision: GainDecision, calibrating: bool) -> str:
    """What a decision was, for counting: a draft that pays, a probe, a stopped request, a
    request held back by a calibration step, or one sitting out the steps after a held draft
    (`held`; the held drafts themselves, which the step could not pay for, and `declined`, rated
    drafts none of whose nodes paid (`decide_rated`), are counted by the caller)."""
    if decision.probe:
        return "probe"
    if decision.held:
        return "held"
    if decision.explore:
        return "explore"
    if decision.nodes > 0:
        return "draft"
    return "calibration" if calibrating else "stopped"


class GainControl:
    """See the module docstring. `max_depth`: the most nodes any request may get;
    `probe_every` / `max_probe_every`: steps a stopped request waits before a probe (doubling
    after each probe not accepted to its end, up to the maximum; see `observe_trees`);
    `probe_nodes`: a probe's size;
    `fixed_row_cost` / `fixed_request_cost`: the costs in tokens that seeded sampled requests
    are decided with; `margin`: measured costs are multiplied by it before deciding (what a
    speculative step costs beyond the model, e.g. the engine's per-step spec-decode handling,
    makes drafts that the model rates break-even lose: docs/never-slower.md); `prior` /
    `prior_weight` / `decay`: the per-request acceptance model; `shadow_probes`: probes of
    requests that are not seeded are shadow probes (budget/shadow.py; the caller turns them
    off for drafters whose trees are verified against their q). Each request's state is a
    `GainRecord` (`new_record`) that the caller keeps with the request and passes in; the
    controller holds only what is pooled (costs, the probe clock, the classes)."""

    def __init__(self, max_depth: int, *, probe_every: int = 8, max_probe_every: int = 64,
                 probe_nodes: int = 2, fixed_row_cost: float = 0.05, fixed_request_cost: float = 0.5,
                 margin: float = 1.5, prior: float = 0.8, prior_weight: float = 1.0,
                 decay: float = 0.1, calibrate_every: int = 32, shadow_probes: bool = False) -> None:
        if max_depth < 1 or probe_every < 1 or max_probe_every < probe_every or probe_nodes < 1 \
                or margin < 1.0 or calibrate_every < 0:
            raise ValueError("need max_depth >= 1, 1 <= probe_every <= max_probe_every, probe_nodes >= 1, "
                             "margin >= 1, calibrate_every >= 0")
        self.margin = float(margin)
        self.calibrate_every = int(calibrate_every)
        self.calibrating = False             # this step: no unseeded request drafts
        self.exploring = False               # this step: rated drafts keep their likely nodes
        self.max_depth = int(max_depth)
        self.probe_every, self.max_probe_every = int(probe_every), int(max_probe_every)
        self.probe_nodes = int(probe_nodes)
        self.shadow_probes = bool(shadow_probes)
        self.fixed_row_cost, self.fixed_request_cost = float(fixed_row_cost), float(fixed_request_cost)
        self.reach = ReachCap(0.5, self.max_depth, prior=prior, prior_weight=prior_weight, decay=decay,
                              keeps_caps=False)
        self.cost = StepCost()
        self._drafter_seconds = 0.0      # per drafting request, moving average
        self._drafting = 1               # requests that drafted in the last speculative step
        self._step = 0                       # steps decided (the shared probe clock)
        self.classes = ClassAcceptance(self.max_depth, prior=prior)
        self._class_interval: dict[str, int] = {}    # first probe interval of a class's requests
        self._costs: GainCosts | None = None         # this step's measured_costs(), once needed

    # -- costs -------------------------------------------------------------------------------
    def measured_costs(self) -> GainCosts:
        """The tokens an extra verified row and a drafting request's fixed cost lose, from the
        measured decode steps (module docstring: a greedy request's fixed cost is its drafter
        time alone); all 0 before the first one (draft, then learn)."""
        if not self.cost.ready:
            return GainCosts(0.0, 0.0, 0.0)
        rate = self.cost.tokens_per_second()
        fit = self.cost.coefficients()
        row, overhead = fit.row, fit.speculative
        drafter = self._drafter_seconds * rate
        return GainCosts(row * rate, overhead / max(self._drafting, 1) * rate + drafter, drafter)

    def step_costs(self) -> GainCosts:
        """`measured_costs()` for this step, computed when a decision first needs it (the fit
        changes only between steps). A step whose requests all wait for their probe never
        needs it, and then skips the fit's solve: that is most sampled steps."""
        if self._costs is None:
            self._costs = self.measured_costs()
        return self._costs

    def costs_this_step(self) -> GainCosts | None:
        """The costs this step decided with; None when no decision needed them."""
        return self._costs

    def step_cost(self) -> float:
        """Tokens a speculative step's overhead costs the batch, whoever drafts in it."""
        if not self.cost.ready:
            return 0.0
        return self.cost.coefficients().speculative * self.cost.tokens_per_second()

    # -- decisions ---------------------------------------------------------------------------
    def new_record(self) -> GainRecord:
        """A new request's state (kept by the caller with the request, passed to `decide` and
        `observe_trees`): no acceptance observed, not stopped."""
        return GainRecord(self.reach.new_record())

    def begin_step(self) -> None:
        """Advance the shared probe clock: call once per step, before that step's `decide`s.
        Every `calibrate_every` steps is a calibration step: no unseeded request drafts, so the
        step cost model sees a step without drafted rows at the current batch size (when every
        request drafts every step, all steps have about the same rows, and the cost of a row
        cannot be told from the cost of the step).
        Half way between two calibration steps is an exploration step, its converse for rated
        drafts (`decide_rated`): each keeps its nodes worth at least EXPLORE_WORTH whatever a
        row is priced at, and the step goes speculative. Without it a server that stopped
        drafting would price draft rows from plain steps alone and never see a draft row again
        to revise the price (measured at 32 greedy clients: every rated draft declined)."""
        self._advance_clock(1)

    def _advance_clock(self, steps: int) -> None:
        """`steps` calls of `begin_step` in one: the clock, and the last step's kind."""
        self._step += steps
        self._costs = None
        self.calibrating = self._calibrates(self._step)
        # steps 15, 47, 79, ... for the default 32 (odd too)
        self.exploring = self.calibrate_every >= 4 and \
            self._step % self.calibrate_every == self.calibrate_every // 2 - 1

    def _calibration_steps(self, start: int, steps: int) -> int:
        """How many of steps start + 1 .. start + steps calibrate (`_calibrates`)."""
        every = self.calibrate_every
        if every <= 0:
            return 0
        # steps s <= n with s % every == every - 1 number (n + 1) // every
        return (start + steps + 1) // every - (start + 1) // every

    def _calibrates(self, step: int) -> bool:
        """Whether step `step` is a calibration step (`begin_step`): steps 31, 63, 95, ... for the
        default 32 (odd: never one of the unseeded probe steps, which are multiples of intervals
        that are powers of two times probe_every; never a request's first step)."""
        return self.calibrate_every > 0 and step % self.calibrate_every == self.calibrate_every - 1

    def decide(self, record: GainRecord, cap: int, seeded_sampled: bool = False,
               costs: GainCosts | None = None, cls: str | None = None) -> GainDecision:
        """The nodes of the request whose state is `record` this step, at most `cap` (its budget
        from the mode, room and eligibility). `costs`: the step's costs (default `step_costs()`,
        computed only if this request's decision needs them); `cls`: an unseeded request's sampling class (its prior and probe interval are
        the class's; ignored for seeded sampled requests, which depend on nothing but themselves)."""
        cap = min(int(cap), self.max_depth)
        if cap <= 0:
            return NO_DRAFT
        settled = self.decide_without_cap(record, seeded_sampled)
        if settled is not None:
            return settled
        prior = None
        if seeded_sampled:
            row_cost, request_cost = self.fixed_row_cost, self.fixed_request_cost
            cls = None
        else:
            costs = costs if costs is not None else self.step_costs()
            row_cost = self.margin * costs.row
            request_cost = self.margin * (costs.request if cls is not None else costs.greedy_request)
            if cls is not None:
                record.cls = cls
                prior = self.classes.rates(cls)
        reach = self.reach.reach(record.acceptance, prior)[:cap]
        n = int(np.count_nonzero(reach >= row_cost)) if row_cost > 0 else cap
        # reach is non-increasing (a cumulative product), so the first n depths are those above
        pays = n > 0 and float(reach[:n].sum()) - n * row_cost > request_cost
        if record.probed:
            record.probed = False
            if cls is not None:         # a probe's verdict sets how soon the class probes next
                now = self._class_interval.get(cls, self.probe_every)
                self._class_interval[cls] = max(self.probe_every, now // 2) if pays else \
                    min(2 * now, self.max_probe_every)
        if pays:
            record.waited = record.interval = None
            record.probing = False
            return GainDecision(n, net=float(reach[:n].sum()) - n * row_cost - request_cost,
                                own=seeded_sampled)
        waited = (record.waited or 0) + 1
        if record.interval is None:
            record.interval = self._class_interval.get(cls, self.probe_every) \
                if cls is not None else self.probe_every
        if self._due(waited, record.interval, seeded_sampled):
            record.waited = 0
            record.probing = True
            return GainDecision(min(cap, self.probe_nodes), probe=True,
                                shadow=self.shadow_probes and not seeded_sampled)
        record.waited = waited
        return NO_DRAFT

    def decide_without_cap(self, record: GainRecord, seeded_sampled: bool = False) -> GainDecision | None:
        """The request's decision when it needs neither its cap nor the step's costs, else None:
        no draft in a calibration step (unseeded), or stopped and waiting for its probe (its
        wait is counted). Callers ask this first to skip a waiting request's other per-step
        checks (most requests of a sampled batch wait), or sitting out the steps after a held
        draft (`hold`); a None leaves the record as it was, so `decide`, which asks too, decides
        it as if unasked."""
        if self.calibrating and not seeded_sampled:
            return NO_DRAFT
        if record.held_for > 0:
            record.held_for -= 1
            return SITTING_OUT
        if record.waited is not None and not record.probed:
            # stopped and nothing new about it since: it waits for its probe without re-deciding
            # (a stopped request learns only from probes, so re-deciding it would cost a reach
            # computation per request and step for nothing)
            waited = record.waited + 1
            if not self._due(waited, record.interval if record.interval is not None else self.probe_every,
                             seeded_sampled):
                record.waited = waited
                return NO_DRAFT
        return None

    def quiet_steps(self, record: GainRecord, seeded_sampled: bool = False) -> int:
        """How many of the next steps `decide_without_cap` certainly settles this request
        without drafting (sitting out after a held draft, or stopped with its probe not yet
        due), counted from the step decided last. A caller that knows this for every request
        of a batch may skip their other per-step work for that many steps (the quiet stretch,
        engine/budget_control.py): at sampled loads most steps are such steps, and their
        per-request checks were the proposer's cost of an idle step. Conservative: 0 when a
        request may need a full decision next step."""
        if record.held_for > 0:
            return record.held_for       # calibration steps do not count down: at least this many
        if record.waited is None or record.probed:
            return 0
        interval = record.interval if record.interval is not None else self.probe_every
        if seeded_sampled:               # its own clock: due once it has waited `interval` steps
            return max(interval - record.waited - 1, 0)
        return interval - self._step % interval - 1   # due no sooner than the next multiple

    def settle_quiet_steps(self, settled: Sequence[tuple[GainRecord, bool]], steps: int
                           ) -> tuple[dict[str, int], int]:
        """`steps` steps of a quiet stretch at once (engine/budget_control.py): the `begin_step`
        and, per (record, seeded_sampled) in `settled`, the `decide_without_cap` calls each of
        them would have made. Returns their decisions counted by kind (`decision_kind`) and how
        many of the steps calibrated. Each request's state moves as those calls would move it (a
        held request's `held_for` down, a stopped one's `waited` up, by the steps that count for
        it), one update per request instead of one per step and request: at 32 clients the
        stretch's catch-up was a sixth of the proposer's time. Exact while no request leaves its
        state within the steps, which `quiet_steps` promises; if one would, the calls run."""
        start = self._step
        calibration = self._calibration_steps(start, steps)
        if not all(self._stays_settled(record, seeded, start, steps, calibration) for record, seeded in settled):
            return self._settle_quiet_steps_one_by_one(settled, steps)
        if steps:
            self._advance_clock(steps)
        counts = dict.fromkeys(("stopped", "held", "calibration"), 0)
        for record, seeded in settled:
            # a seeded request does not sit calibration steps out: they count for it too
            counted = steps if seeded else steps - calibration
            if record.held_for > 0:
                record.held_for -= counted
                counts["held"] += counted                    # (SITTING_OUT in every step it counts)
                counts["calibration"] += steps - counted
            else:
                record.waited += counted
                counts["stopped"] += steps - calibration     # (NO_DRAFT, counted as calibration
                counts["calibration"] += calibration         # in a calibration step, seeded or not)
        return {kind: n for kind, n in counts.items() if n}, calibration

    def _stays_settled(self, record: GainRecord, seeded_sampled: bool, start: int, steps: int,
                       calibration: int) -> bool:
        """Whether `decide_without_cap` settles the request in each of the `steps` steps after
        step `start` the same way (sitting out, or stopped with its probe not due)."""
        counted = steps if seeded_sampled else steps - calibration
        if record.held_for > 0:
            return record.held_for >= counted
        if record.waited is None or record.probed:
            return False
        interval = record.interval if record.interval is not None else self.probe_every
        if seeded_sampled:
            return record.waited + counted < interval
        return start % interval + steps < interval       # no step of the range is a probe step

    def _settle_quiet_steps_one_by_one(self, settled: Sequence[tuple[GainRecord, bool]], steps: int
                                       ) -> tuple[dict[str, int], int]:
        """`settle_quiet_steps` by the calls themselves, in order."""
        counts: dict[str, int] = {}
        calibration = 0
        for _ in range(steps):
            self.begin_step()
            calibration += self.calibrating
            for record, seeded in settled:
                kind = decision_kind(self.decide_without_cap(record, seeded), self.calibrating)
                counts[kind] = counts.get(kind, 0) + 1
        return counts, calibration

    def node_scores(self, records: Sequence[GainRecord], ratings: np.ndarray, depths: np.ndarray,
                    offsets: np.ndarray) -> np.ndarray:
        """Confidence mode: each drafted node's score, the larger of the drafter's rating (its
        path probability) and its request's own reach at the node's depth (the history rule's
        estimate). The pooled rating undervalues a request that is copying an earlier answer,
        its history undervalues one that has just started to. The larger of two estimates is
        biased upward, so the score, not the rating, is what DraftCalibration maps to measured
        acceptance: calibrated on the rating alone, nodes lifted by their history were kept at
        the history's word (SmolLM2, 8 greedy clients: ~3.4 rows per request accepted at 0.13
        tokens a row where a row was priced 0.18; docs/never-slower.md, "confidence")."""
        sizes = np.diff(offsets)
        ratings = np.asarray(ratings, dtype=np.float64)
        if not records or ratings.size == 0:
            return ratings
        own = self.reach.reach_many([r.acceptance for r in records])          # [T, max_depth]
        tree_of = np.repeat(np.arange(len(records)), sizes)
        return np.maximum(ratings, own[tree_of, np.clip(np.asarray(depths) - 1, 0, own.shape[1] - 1)])

    def decide_rated(self, records: Sequence[GainRecord], worth: np.ndarray, offsets: np.ndarray,
                     costs: GainCosts) -> list[GainDecision]:
        """Confidence mode (budget/confidence.py), greedy requests, one step: each request has
        drafted a tree, whose nodes are worth `worth[offsets[t]:offsets[t+1]]` tokens (their
        `node_scores`, calibrated on what was accepted). Each keeps the longest prefix whose
        every node is worth its row (times the margin), if the kept nodes' net gain is positive
        (its drafter time is spent already). No stopped state or probes: every step's own draft
        is rated afresh."""
        kept, net = keep_prefixes(np.asarray(worth, dtype=np.float64), offsets,
                                  EXPLORE_WORTH if self.exploring else self.margin * costs.row)
        decisions = []
        for record, n, gain in zip(records, kept.tolist(), net.tolist()):
            record.waited = record.interval = None
            record.probing = record.probed = False
            decisions.append(GainDecision(n, net=gain, explore=self.exploring)
                             if n > 0 and (gain > 0 or self.exploring) else NO_DRAFT)
        return decisions

    def settle(self, decisions: Sequence[GainDecision]) -> bool:
        """Whether this step's drafts together pay for making it speculative (module docstring).
        The speculative step's overhead (spec-decode metadata and tree acceptance for every
        request in the step) is paid once, by the step. So unless the step is speculative
        anyway (a verified probe, or a seeded request, which decides on its own history), its drafts go
        ahead only if their summed net gain (each net of its own costs) exceeds the whole
        overhead (times the margin); otherwise the caller holds them back and the step is a
        plain one. The held requests keep their state and decide again next step, except
        unseeded sampled ones, which the caller `hold`s. Shadow probes are verified in no step:
        they neither pay for one nor are held."""
        drafts = [d for d in decisions if d.nodes > 0 and not d.shadow]
        if not drafts or any(d.probe or d.own or d.explore for d in drafts):
            return True
        return sum(d.net for d in drafts) > self.margin * self.step_cost()

    def hold(self, record: GainRecord) -> None:
        """`settle` held this request's draft back. An unseeded sampled request then sits out
        the next `probe_every` steps without deciding (`decide_without_cap`): while it does not
        draft its acceptance cannot change, so each step would decide it in full (its reach and
        the step's cost fit) only to hold it again. Served at one client and temperature 0.7,
        that was a quarter of all decisions (`served_gain_lookup_online_t07_c1_code-lm.json`).
        Greedy and seeded requests decide again next step: a greedy request's drafts pay in whichever step the
        others' make the step speculative, and a seeded one decides on its own history alone."""
        if record.cls is not None:
            record.held_for = self.probe_every

    def _due(self, waited: int, interval: int, seeded_sampled: bool) -> bool:
        """Is a stopped request's probe due? A verified probe makes its whole step speculative
        (tree acceptance for every request in it), so unseeded requests probe together, on the steps
        that are multiples of their interval; a seeded request keeps its own clock (its tokens
        must not depend on other traffic)."""
        if seeded_sampled:
            return waited >= interval
        return waited >= (interval + 1) // 2 and self._step % interval == 0

    # -- observations --------------------------------------------------------------------------
    def observe_trees(self, records: Sequence[GainRecord], depths: Sequence[int],
                      accepted: Sequence[int]) -> None:
        """One verified step: per drafted request its state, its deepest node's depth and
        accepted length.
        A probe that is not accepted to its end doubles the request's probe interval (up to the
        maximum): a verified probe makes its whole step speculative and a shadow probe costs a
        drafter call, so a request whose probes accept a little but not enough to draft must not
        probe often. One accepted to its end resets
        the interval: its text is matching again, and one 2-node probe moves its acceptance too
        little to resume drafting at once (served at 8 greedy clients, 90% of decisions were
        `stopped` while probes accepted 2.3 tokens per tree). The interval also resets when
        drafting pays again (`decide`)."""
        self.reach.observe([r.acceptance for r in records], depths, accepted)
        for record, depth, acc in zip(records, depths, accepted):
            if record.cls is not None:
                self.classes.observe(record.cls, depth, acc)
            if record.probing:
                record.probing, record.probed = False, True
                interval = record.interval if record.interval is not None else self.probe_every
                record.interval = self.probe_every if acc >= depth else min(2 * interval, self.max_probe_every)

    def observe_plain_steps(self, seconds: Sequence[float], requests: int) -> None:
        """`observe_step(s, requests, 0, requests)` for each of `seconds`, in one call
        (`StepCost.observe_plain`)."""
        self.cost.observe_plain(seconds, requests)

    def observe_step(self, seconds: float, requests: int, draft_rows: int, emitted: int,
                     drafting: int = 0, drafter_seconds: float = 0.0,
                     overhead_seconds: float = 0.0) -> None:
        """One decode step's cost (see `StepCost.observe`); `drafting` requests drafted the
        trees it verified, in `drafter_seconds` of drafter time."""
        self.cost.observe(seconds, requests, draft_rows, emitted, overhead_seconds)
        if draft_rows > 0 and drafting > 0:
            self._drafting = drafting
            self._drafter_seconds += 0.1 * (drafter_seconds / drafting - self._drafter_seconds)
