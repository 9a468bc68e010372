"""How many draft nodes each request may get this step, and what each step teaches the rules that
decide it.

The rules: the load-dependent budget policy (budget.mode: fixed, table, auto; chosen per step from
the decoding batch), then per request max_model_len, max_tokens, the request's own cap,
budget.reach_floor (budget/reach.py) and budget.gain (budget/gain.py). They learn from the
measured step times and from the depths each verified tree reached and accepted.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from vllm_treespec.budget import make_budget_policy
from vllm_treespec.budget.confidence import GREEDY_CLASS, DraftCalibration, batch_path_probs, batch_sources
from vllm_treespec.budget.gain import GainControl, GainDecision, GainRecord, decision_kind
from vllm_treespec.budget.guard import SpeculationGuard
from vllm_treespec.budget.reach import ReachCap
from vllm_treespec.budget.shadow import ShadowProbe
from vllm_treespec.config import TreespecConfig
from vllm_treespec.engine.request_table import RequestTable
from vllm_treespec.engine.runner_state import request_limits, request_temperature, total_scheduled_tokens
from vllm_treespec.engine.tree_stats import TreeStats
from vllm_treespec.engine.tree_step import TreeStep

from vllm.logger import init_logger

logger = init_logger(f"vllm.{__name__}")

__all__ = ["BudgetControl"]

# a step's period of this many times its own seconds or more spans an idle gap (no request for a
# while), not the step: budget.gain prices the step by its own seconds then, the guard skips it
IDLE_GAP_FACTOR = 20
# the longest quiet stretch without budget.gain (`BudgetControl._unbudgeted_stretch`): its steps
# are counted in the statistics when it ends
UNBUDGETED_STRETCH_STEPS = 256


class BudgetControl:
    def __init__(self, config: TreespecConfig, num_speculative_tokens: int, stats: TreeStats,
                 vllm_config: Any) -> None:
        self.node_budget = config.node_budget(num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        sched = vllm_config.scheduler_config
        # the largest verify step the deployment can schedule (the startup profile's range)
        self._max_verify_tokens = min(int(sched.max_num_batched_tokens),
                                      int(sched.max_num_seqs) * (1 + self.node_budget))
        self.stats = stats
        self.config = config.budget
        self.policy = make_budget_policy(config.budget, num_speculative_tokens)
        # budget.reach_floor: no deeper than each request accepts with that probability
        floor = config.budget.reach_floor
        self.reach = ReachCap(floor, max_depth=self.node_budget) if floor > 0 else None
        # budget.gain: each request drafts only what pays at the current load
        gain = config.budget.gain
        self.gain = GainControl(
            self.node_budget, probe_every=gain.probe_every, max_probe_every=gain.max_probe_every,
            probe_nodes=gain.probe_nodes, fixed_row_cost=gain.fixed_row_cost,
            fixed_request_cost=gain.fixed_request_cost, margin=gain.margin,
            calibrate_every=gain.calibrate_every, shadow_probes=gain.shadow_probes) if gain.enabled else None
        self._shadows: set[str] = set()    # requests whose shadow probe waits for their tokens
        # budget.gain.guard: drafting paused while measured slower than no drafts (budget/guard.py)
        self.guard = SpeculationGuard() if gain.enabled and gain.guard else None
        self._last_step_at: float | None = None       # when the last step was observed (the guard's period)
        self._guard_shown: tuple[float | None, bool] | None = None   # what the guard's gauges show
        # budget.gain.confidence: greedy requests draft first and keep what their drafter's
        # calibrated ratings say pays (budget/confidence.py). Any drafter: greedy trees are never
        # drawn from a drafter's q (only sampled requests' are), so no q rows are cut with them
        self.calibration = DraftCalibration() if gain.enabled and gain.confidence else None
        self.calibrate_score = gain.calibrate_score
        # a step's gain decisions between `caps` and `rate_drafts` when some wait for their drafts:
        # (decided per request index, the records of those decided in full, the indices that wait)
        self._pending: tuple[dict[int, GainDecision | None], dict[int, GainRecord], list[int]] | None = None
        self._shadow_indices: list[int] | None = None    # ... and those drafting a shadow probe
        self.step_held = False         # this step's drafts were held back (`_settle`)
        # auto budgets depend on each rank's own timings: rank 0's choice is broadcast every step
        # so all tensor-parallel ranks draft the same trees
        self._tensor_parallel = int(vllm_config.parallel_config.tensor_parallel_size) > 1
        self._sync = config.budget.mode == "auto" and self._tensor_parallel
        # the last verified step's (budgets, accepted, drafted) per tree, for the policy's observe
        self._verified: tuple[list[int], list[int], list[int]] | None = None
        self.draft_seconds = 0.0       # the last drafting call's seconds
        self.spec_overhead = 0.0       # the last speculative step's seconds outside the forward
        self.last_propose_end: float | None = None    # when the last drafts were returned
        self._quiet: _QuietStretch | None = None       # steps in which nobody can draft (`_quiet_stretch`)
        self._every_step = False       # the drafter is called every step (it reads the target's states)

    def use_drafter(self, capabilities: Any) -> None:
        """Shadow probes only for drafts verified by the target-only rule: a drafter that samples
        its drafts (q rows, recursive rejection) accepts more than the tokens sampled next would
        show, and one that reads the target's states drafts from rows a plain step does not
        hand it in the same form (budget/shadow.py)."""
        if self.gain is not None and (capabilities.samples_drafts or capabilities.uses_target_states):
            self.gain.shadow_probes = False
        self._every_step = bool(capabilities.uses_target_states)

    def profile_verify_cost(self, runner: Any) -> None:
        """budget.mode auto without budget.auto.profile (and startup_profile on): time the target's
        forward at 1, 2, 4, ... query tokens (engine/verify_profile.py) and seed the policy's cost
        model."""
        auto = self.config.auto
        if self.config.mode != "auto" or auto.profile is not None or not auto.startup_profile:
            return
        from vllm_treespec.engine.verify_profile import measure_step_seconds, profile_sizes

        start = time.perf_counter()
        points = measure_step_seconds(runner, profile_sizes(self._max_verify_tokens))
        self.policy.cost.seed(points)
        logger.info("TreeProposer: verify cost profiled in %.1f s (query tokens -> ms): %s",
                    time.perf_counter() - start, ", ".join(f"{q}: {s * 1e3:.2f}" for q, s in points))

    # -- per step: the caps ---------------------------------------------------------------------
    def caps(self, requests: RequestTable, runner: Any, req_ids: Sequence[str], lengths: Sequence[int],
             decoding: Sequence[bool], budget: int) -> tuple[list[int], Any]:
        """(node cap per request, the policy's BudgetChoice): 0 for requests that do not decode
        or may not draft this step (their fallback reason is counted)."""
        self.end_quiet(requests)
        active = [t for t, d in zip(lengths, decoding) if d]
        choice = self.policy.choose(len(active), sum(active) // len(active) if active else 0)
        chosen = _broadcast_from_first_rank(choice.nodes) if self._sync else choice.nodes
        if active:
            self.stats.observe_budget_choice(chosen)
        budget = min(budget, chosen)
        caps = [min(budget, max(self.max_model_len - t, 0)) if d else 0 for t, d in zip(lengths, decoding)]
        decided: dict[int, GainDecision | None] = {}   # budget.gain's decision per request index
        records: dict[int, GainRecord] = {}            # ... and the state of those decided in full
        rated: list[int] = []          # request indices decided on their drafts (`rate_drafts`)
        shadow: list[int] = []         # request indices drafting a shadow probe (`keep_shadow_probes`)
        paused_rows: list[int] = []    # request indices the guard's pause kept from drafting
        self._pending = None
        self.step_held = False
        if self.gain is not None:
            self.gain.begin_step()
        paused = self.guard is not None and not self.guard.allows
        for i, cap in enumerate(caps):
            if not cap:
                continue
            req_id = req_ids[i]
            known = requests.get(req_id)
            if paused:
                # the guard paused drafting, except for seeded sampled requests (their tokens
                # must not depend on other traffic): their options tell which they are
                st = known if known is not None else requests.state(req_id)
                if not st.options_checked:
                    requests.blocker(req_id, runner)
                if not st.seeded_sampled:
                    caps[i] = 0
                    paused_rows.append(i)
                    continue
            if self.gain is not None and known is not None and known.gain is not None:
                # decided before: if it is waiting for a probe (or the step calibrates) nothing
                # else about it matters this step; its blocker was None when it was decided
                settled = self.gain.decide_without_cap(known.gain, known.seeded_sampled)
                if settled is not None:
                    caps[i] = 0
                    decided[i] = settled
                    continue
            reason = requests.blocker(req_id, runner)
            st = requests[req_id]
            if reason is not None:
                caps[i] = 0
                st.fallback_steps[reason] = st.fallback_steps.get(reason, 0) + 1
                self.stats.observe_fallback(reason)
                continue
            caps[i] = min(cap, self._output_room(runner, req_id, lengths[i]))
            if st.max_nodes is not None:
                caps[i] = min(caps[i], st.max_nodes)
            if self.reach is not None:
                st.reach_class = ReachCap.sampling_class(request_temperature(runner, req_id))
                caps[i] = min(caps[i], self.reach.cap(st.reach))
            if self.gain is not None and caps[i] > 0:
                if self.calibration is not None and st.is_greedy and not self.gain.calibrating:
                    rated.append(i)
                    continue
                records[i] = record = st.gain_record(self.gain)
                decision = self.gain.decide(record, caps[i], st.seeded_sampled, cls=st.gain_class)
                caps[i] = decision.nodes
                decided[i] = decision
                if decision.shadow:
                    shadow.append(i)
        self._shadow_indices = shadow or None
        if rated:
            self._pending = (decided, records, rated)
        elif decided:
            self._settle(caps, decided, records)
        self._quiet = self._quiet_stretch(requests, req_ids, lengths, decoding, decided, rated, shadow,
                                          paused_rows, chosen)
        return caps, choice

    # -- the quiet stretch: steps in which no request can draft ---------------------------------
    def _quiet_stretch(self, requests: RequestTable, req_ids: Sequence[str], lengths: Sequence[int],
                       decoding: Sequence[bool], decided: dict[int, GainDecision | None],
                       rated: Sequence[int], shadow: Sequence[int], paused_rows: Sequence[int],
                       chosen: int) -> _QuietStretch | None:
        """After a step in which no request of the batch drafts, each either decided by
        budget.gain to draft nothing (stopped and waiting for its probe, or sitting out; decided
        in full or settled without a full decision) or kept out by the
        guard's pause, the steps in which that certainly stays so: those
        budget.gain settles again (GainControl.quiet_steps) while the guard's verdict stands,
        and no cap can reach 0 for another reason. While the batch stays the same, those steps
        are skipped (served: `quiet_ahead` and `take_quiet_step`, vLLM sampling them as plain
        steps; else `quiet_step`) and their decisions are made and counted in one go when the
        stretch ends (`end_quiet`). Why: at sampled loads most steps are such steps, and
        their per-request bookkeeping, a few microseconds hot, was most of what an idle
        speculative server spent beyond vLLM's own step with its caches cold
        (docs/never-slower.md section 1). Only under a fixed budget policy (its choice cannot
        change within the stretch) and a drafter that needs no call per step. Without
        budget.gain: `_unbudgeted_stretch`."""
        n = len(req_ids)
        if self.gain is None:
            return self._unbudgeted_stretch(requests, req_ids, lengths, decoding, chosen)
        if not n or len(decided) + len(paused_rows) != n or rated or shadow \
                or self._shadows or self.policy.mode != "fixed" or not chosen or not all(decoding) \
                or self._every_step or any(d is not None and d.nodes > 0 for d in decided.values()):
            return None
        steps = min(self.gain.max_probe_every, self.max_model_len - max(lengths) - 1)
        members, settled = [], []
        for i, req_id in enumerate(req_ids):
            st = requests.get(req_id)
            if st is None:
                return None
            members.append(st)
            if i in decided:
                if st.gain is None:
                    return None
                steps = min(steps, self.gain.quiet_steps(st.gain, st.seeded_sampled))
                settled.append(st)
            if steps <= 0:
                return None
        allows = self.guard is None or self.guard.allows
        if self.guard is not None:
            # no further than the guard's verdict certainly stands: its steps are then fed at the
            # stretch's end (`_replay_quiet_observations`)
            steps = min(steps, self.guard.steady_steps(n))
            if steps <= 0:
                return None
        return _QuietStretch(list(req_ids), members, settled, steps, chosen, allows)

    def _unbudgeted_stretch(self, requests: RequestTable, req_ids: Sequence[str], lengths: Sequence[int],
                            decoding: Sequence[bool], chosen: int) -> _QuietStretch | None:
        """Without budget.gain, a quiet stretch where the budget policy gives the batch no node
        (a fixed 0, or a table's 0 at this batch size) and chooses by the batch's size alone
        (`BudgetPolicy.chooses_by_batch_size`), which the stretch keeps: nobody drafts while the
        batch stays the same. Why: drafting configured off must cost what a plain step costs
        (the free-idle pair, docs/never-slower.md section 1), and the proposer's full step was
        2-3% of an idle sampled step on the dev VM. At most `UNBUDGETED_STRETCH_STEPS` steps, so
        that the steps' statistics are counted every so often."""
        n = len(req_ids)
        if chosen or not n or not all(decoding) or self._every_step or not self.policy.chooses_by_batch_size:
            return None
        members = [requests.get(r) for r in req_ids]
        if any(st is None for st in members):
            return None
        steps = min(UNBUDGETED_STRETCH_STEPS, self.max_model_len - max(lengths) - 1)
        if steps <= 0:
            return None
        return _QuietStretch(list(req_ids), members, [], steps, chosen, True)

    def _continues_stretch(self, req_ids: Sequence[str]) -> bool:
        """Whether the quiet stretch (`_quiet_stretch`) may go on into this step: steps left, the
        same batch, no shadow probe waiting, the guard's verdict the stretch holds under."""
        quiet = self._quiet
        return (quiet is not None and quiet.steps > 0 and not self._shadows and quiet.req_ids == req_ids
                and (self.guard is None or self.guard.allows == quiet.allows))

    def quiet_step(self, req_ids: Sequence[str], sampled_token_ids: Sequence[Sequence[int]]) -> bool:
        """Whether this step is one of the quiet stretch (`_continues_stretch`, every request
        decoding). Then nobody drafts and the caller returns no drafts at once; a False sends it
        down the full path (`caps`), which ends the stretch first."""
        if not self._continues_stretch(req_ids) or not all(sampled_token_ids[:len(req_ids)]):
            return False
        self._quiet.take_step()
        return True

    def quiet_ahead(self, scheduler_output: Any, started_at: float | None, req_ids: Sequence[str]) -> bool:
        """Whether the step about to be sampled is certainly one of the quiet stretch
        (`_quiet_stretch`): steps left, the same batch (`req_ids`: the runner's live list, not a
        copy) each scheduled one row and nothing drafted, no shadow probe waiting, the guard's
        verdict the stretch holds under (the stretch ends before the guard could change it,
        `SpeculationGuard.steady_steps`). Then the step is taken by `take_quiet_step` alone (after
        the caller checked that every request sampled a token), and vLLM may sample it as a
        plain step.
        Not under tensor parallelism: there every step feeds the guard (a broadcast)."""
        if started_at is None or self._tensor_parallel or self._verified is not None \
                or not self._continues_stretch(req_ids):
            return False
        n = len(req_ids)
        return (not scheduler_output.scheduled_spec_decode_tokens and len(scheduler_output.num_scheduled_tokens) == n
                and total_scheduled_tokens(scheduler_output) == n)

    def take_quiet_step(self, started_at: float) -> None:
        """The whole of a quiet stretch's step (`quiet_ahead` said it is one; `started_at`: when
        its input preparation began): its cost for budget.gain, its period for the guard and its
        worker-step time are kept, to be observed when the stretch ends
        (`_replay_quiet_observations`: the same calls in the same order, run hot), and its
        decisions are made then (`end_quiet`). Why one call: in an idle step each function the
        proposer touches costs microseconds with the caches cold from the forward pass."""
        quiet = self._quiet
        now = time.perf_counter()
        last, self._last_step_at = self._last_step_at, now
        seconds = now - started_at
        quiet.observed.append((self._gain_period(now, seconds), _guard_period(now, last, seconds), seconds))
        quiet.take_step()
        self.draft_seconds = 0.0
        self.last_propose_end = now

    def _replay_quiet_observations(self) -> None:
        """What `take_quiet_step` kept: each step's cost for budget.gain (a decode step of one row
        per request, nothing drafted or verified), its period for the guard and its worker-step
        time for the statistics, as `observe_step` and the proposer would have observed them, in
        order, each in one update (per step they were about a third of the full step that ended
        the stretch, docs/never-slower.md section 1). The guard's verdict cannot change on them
        (`SpeculationGuard.steady_steps` bounds the stretch), so `SpeculationGuard.steady` adds
        them up."""
        quiet = self._quiet
        if quiet is None or not quiet.observed:
            return
        observed, quiet.observed = quiet.observed, []
        n = len(quiet.req_ids)
        gain_periods, guard_periods, seconds = zip(*observed)
        self.stats.plain_quiet_steps += len(observed)
        if self.gain is not None:
            self.gain.observe_plain_steps(gain_periods, n)
        if self.guard is not None:
            self.guard.steady(guard_periods, n, n)
        self.stats.observe_steps(seconds)

    def end_quiet(self, requests: RequestTable) -> None:
        """Make the skipped steps' decisions and counts (what the `begin_step` and
        `decide_without_cap` calls each step's `caps` would have made come to,
        `GainControl.settle_quiet_steps`; the requests the guard's pause kept out are not
        decided) and forget the stretch. Called
        before anything reads or changes the requests' gain state."""
        self._replay_quiet_observations()
        quiet, self._quiet = self._quiet, None
        if quiet is None or not quiet.done:
            return
        if self.gain is None:           # a zero budget's stretch (`_unbudgeted_stretch`): no decisions
            counts, calibration_steps = {}, 0
        else:
            counts, calibration_steps = self.gain.settle_quiet_steps(
                [(st.gain, st.seeded_sampled) for st in quiet.settled], quiet.done)
        for st in quiet.members:
            st.steps += quiet.done
        self.stats.observe_quiet_steps(quiet.done, len(quiet.members), calibration_steps, quiet.chosen, counts,
                                       idle_kind="no drafts" if quiet.allows else "paused")

    def rate_drafts(self, requests: RequestTable, req_ids: Sequence[str], proposal: Any,
                    caps: list[int]) -> None:
        """budget.gain.confidence: the step's drafts rated by the drafter, cut to what pays
        (GainControl.decide_rated), then the step settled as a whole (`GainControl.settle`).
        Changes `proposal.trees` and `caps` in place; a no-op when no decision waits for a draft."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        decided, records, rated = pending
        assert self.gain is not None and self.calibration is not None
        drafted = []                                  # request indices with a tree to rate
        for i in rated:
            requests.state(req_ids[i]).rated = None
            tree = proposal.trees[i] if proposal is not None else None
            if tree is None or tree.num_draft == 0:
                decided[i], caps[i] = GainDecision(0), 0
            else:
                drafted.append(i)
        if drafted:
            trees = [proposal.trees[i] for i in drafted]
            probs, offsets = batch_path_probs(trees)
            sources = batch_sources(trees)            # one calibration curve per node source
            depths = np.concatenate([t.depth[1:] for t in trees])
            states = [requests.state(req_ids[i]) for i in drafted]
            gain_records = [st.gain_record(self.gain) for st in states]
            if self.calibrate_score:             # the score decided by is the one calibrated
                scores = self.gain.node_scores(gain_records, probs, depths, offsets)
                worth = self.calibration.worth(GREEDY_CLASS, scores, sources)
            else:                                # budget.gain.calibrate_score false: the rating is
                scores = probs
                worth = self.gain.node_scores(gain_records, self.calibration.worth(GREEDY_CLASS, probs, sources),
                                              depths, offsets)
            decisions = self.gain.decide_rated(gain_records, worth, offsets, self.gain.step_costs())
            for i, tree, st, decision, start in zip(drafted, trees, states, decisions, offsets.tolist()):
                n = decision.nodes
                decided[i], caps[i] = decision, n
                if n < tree.num_draft:
                    proposal.trees[i] = tree.prefix(n)
                if n:
                    st.rated = (scores[start:start + n], sources[start:start + n])   # what calibration learns
        self._settle(caps, decided, records, rated, proposal, requests, req_ids)

    def _settle(self, caps: list[int], decided: dict[int, GainDecision | None], records: dict[int, GainRecord],
                rated: Sequence[int] = (), proposal: Any = None, requests: RequestTable | None = None,
                req_ids: Sequence[str] = ()) -> None:
        """Hold every draft back when together they do not pay for a speculative step (requests
        decided in full, `records`, sit out the next steps if GainControl.hold says so), then
        count the step's decisions (rated requests left with nothing: `declined`)."""
        assert self.gain is not None
        rated = set(rated)
        drafts = [d for d in decided.values() if d is not None and d.nodes > 0]
        if drafts and not self.gain.settle(drafts):
            self.step_held = True
            for i, decision in decided.items():       # drafts that cannot pay for the step
                if decision is not None and decision.nodes > 0 and not decision.shadow:
                    caps[i] = 0
                    decided[i] = None
                    if i in records:
                        self.gain.hold(records[i])
                    if i in rated:
                        proposal.trees[i] = proposal.trees[i].prefix(0)
                        requests.state(req_ids[i]).rated = None
        counts: dict[str, int] = {}     # the kinds that occurred (GAIN_DECISIONS)
        calibrating = self.gain.calibrating
        for i, decision in decided.items():
            if decision is None:
                kind = "held"
            elif decision.nodes == 0 and i in rated:
                kind = "declined"
            else:
                kind = decision_kind(decision, calibrating)
            counts[kind] = counts.get(kind, 0) + 1
        costs = self.gain.costs_this_step()
        self.stats.observe_gain(counts, costs, self.gain.cost.coefficients() if costs is not None else None)

    def step_kind(self, drafted: bool, decoding: Sequence[bool]) -> str:
        """Why this step is speculative or plain, for counting: speculative, prefill (nobody
        decodes), held (`_settle` held its drafts back), calibration or no drafts."""
        if drafted:
            return "speculative"
        if not any(decoding):
            return "prefill"
        if self.step_held:
            return "held"
        if self.gain is not None and self.gain.calibrating:
            return "calibration"
        if self.guard is not None and not self.guard.allows:
            return "paused"
        return "no drafts"

    # -- shadow probes (budget/shadow.py) ---------------------------------------------------------
    def keep_shadow_probes(self, requests: RequestTable, req_ids: Sequence[str], proposal: Any,
                           caps: list[int], lengths: Sequence[int]) -> None:
        """Take this step's shadow probes out of the proposal (their trees are kept with their
        requests, their caps set to 0), so that they are verified in no step."""
        if self._shadow_indices is None:
            return
        indices, self._shadow_indices = self._shadow_indices, None
        for i in indices:
            tree = proposal.trees[i] if proposal is not None else None
            caps[i] = 0
            if tree is None or tree.num_draft == 0:
                continue
            req_id = req_ids[i]
            requests.state(req_id).shadow = ShadowProbe(tree, int(lengths[i]))
            self._shadows.add(req_id)
            proposal.trees[i] = tree.prefix(0)

    def settle_shadow_probes(self, requests: RequestTable, req_ids: Sequence[str], token_ids: Any,
                             lengths: Sequence[int]) -> None:
        """Walk each waiting shadow probe with the tokens its request produced since it was
        drafted; those decided are observed as verified trees of their requests would be, all in
        one update (probes of a class are due on the same steps: at 32 clients one update per
        probe recomputed the pooled reach statistics once per probe)."""
        if not self._shadows:
            return
        assert self.gain is not None
        where = {req_id: i for i, req_id in enumerate(req_ids)}
        states, depths, accepted_lengths = [], [], []
        for req_id in list(self._shadows):
            st = requests.get(req_id)
            probe = st.shadow if st is not None else None
            if probe is None:                          # finished, or replaced by a newer probe
                self._shadows.discard(req_id)
                continue
            i = where.get(req_id)
            if i is None:                              # not in this step's batch (preempted)
                continue
            settled = probe.settle(token_ids[i, probe.start:int(lengths[i])].tolist())
            if settled is None:
                continue
            depth, accepted = settled
            st.shadow = None
            self._shadows.discard(req_id)
            states.append(st)
            depths.append(depth)
            accepted_lengths.append(accepted)
            self.stats.observe_shadow_probe(accepted)
        if states:
            self._observe_depths(requests, states, depths, accepted_lengths)

    def _output_room(self, runner: Any, req_id: str, num_tokens: int) -> int:
        """Drafts the request can still emit: max_tokens minus its output so far, minus the token
        the next step emits anyway. Deeper nodes would be verified rows whose tokens are cut
        (and counted as accepted by vLLM's spec-decode counters although never emitted)."""
        limits = request_limits(runner, req_id)
        if limits is None:
            return self.node_budget
        max_tokens, num_prompt = limits
        return max(max_tokens - (num_tokens - num_prompt) - 1, 0)

    # -- learning -------------------------------------------------------------------------------
    def observe_verified(self, requests: RequestTable, step: TreeStep, accepted_len: list[int],
                         sizes: list[int], accepted_nodes: np.ndarray | None = None) -> None:
        """A verified step's trees: per tree its budget, accepted and drafted nodes (for the
        policy, at the next `observe_step`), the depths reached (reach and gain rules) and, for
        rated drafts, which of their nodes were accepted (`accepted_nodes`: int [trees, W] local
        node ids, -1 padded; budget.gain.confidence)."""
        self._verified = ([st.budget_given if (st := requests.get(r)) is not None else 0 for r in step.req_ids],
                          accepted_len, sizes)
        self.end_quiet(requests)       # (no step of a quiet stretch verifies: a no-op but for order)
        if self.calibration is not None and accepted_nodes is not None:
            self._observe_rated(requests, step.req_ids, sizes, accepted_nodes)
        if (self.reach is None and self.gain is None) or not step.num_trees:
            return
        offsets = step.trees.offsets.numpy()
        depths = np.maximum.reduceat(step.trees.depth.numpy(), offsets[:-1]).tolist()
        self._observe_depths(requests, [requests.state(r) for r in step.req_ids], depths, accepted_len)

    def _observe_depths(self, requests: RequestTable, states: Sequence[Any], depths: Sequence[int],
                        accepted: Sequence[int]) -> None:
        """The reach and gain rules learn from trees, each its request's state, deepest node depth
        and accepted length: verified trees and settled shadow probes alike."""
        if self.reach is not None:
            self.reach.observe([st.reach_record(self.reach) for st in states], depths, accepted)
            self.stats.observe_reach(self.reach_means(requests))
        if self.gain is not None:
            self.gain.observe_trees([st.gain_record(self.gain) for st in states], depths, accepted)

    def _observe_rated(self, requests: RequestTable, req_ids: Sequence[str], sizes: Sequence[int],
                       accepted_nodes: np.ndarray) -> None:
        """Calibrate the drafter's ratings on the verified nodes of rated drafts (as many as vLLM
        scheduled of each: it may cut a tree to a prefix), all of the step's trees in one update
        (per tree it was a few numpy calls per request and step)."""
        assert self.calibration is not None
        trees, rated, sources = [], [], []
        for t, req_id in enumerate(req_ids):
            st = requests.get(req_id)
            if st is None or st.rated is None:
                continue
            (probs, source), st.rated = st.rated, None
            trees.append(t)
            kept_here = min(int(sizes[t]), probs.size)
            rated.append(probs[:kept_here])
            sources.append(source[:kept_here])
        if not trees:
            return
        kept = np.fromiter((p.size for p in rated), dtype=np.int64, count=len(rated))
        starts = np.concatenate([[0], np.cumsum(kept)[:-1]])
        nodes = np.asarray(accepted_nodes)[trees]                    # [rated trees, W] local ids, -1 padded
        on_path = (nodes >= 1) & (nodes <= kept[:, None])
        accepted = np.zeros(int(kept.sum()), dtype=bool)
        accepted[(starts[:, None] + nodes - 1)[on_path]] = True
        self.calibration.observe(GREEDY_CLASS, np.concatenate(rated), accepted, np.concatenate(sources))

    def reach_means(self, requests: RequestTable) -> dict[str, float]:
        """Mean reach cap of the live requests of each sampling class (for stats and /metrics)."""
        assert self.reach is not None
        per: dict[str, list[int]] = {}
        for st in requests.values():
            if st.reach_class is not None:
                per.setdefault(st.reach_class, []).append(self.reach.cap(st.reach))
        return {cls: sum(c) / len(c) for cls, c in per.items()}

    def observe_step(self, scheduler_output: Any, started_at: float | None) -> None:
        """Tell the budget policy what the step that just ran cost and how much it accepted:
        target seconds from `_prepare_inputs` (`started_at`) to here (forward + verification),
        the previous drafting time, and per verified tree its budget, accepted and drafted nodes."""
        self._replay_quiet_observations()
        now = time.perf_counter()
        last, self._last_step_at = self._last_step_at, now
        if started_at is None:
            self._verified = None
            return
        seconds = now - started_at
        query = total_scheduled_tokens(scheduler_output)
        budgets, accepted, drafted = self._verified or ([], [], [])
        self._verified = None
        if self.gain is not None:
            # budget.gain and its guard learn from pure decode steps only (a prompt chunk's rows
            # cost differently): one row per request plus the scheduled drafts, priced apart
            num_reqs = len(scheduler_output.num_scheduled_tokens)
            draft_rows = sum(len(d) for d in scheduler_output.scheduled_spec_decode_tokens.values())
            decode = query > 0 and query == num_reqs + draft_rows
            if self.guard is not None:
                self._guard_step(_guard_period(now, last, seconds) if decode else None, num_reqs, accepted)
            if decode:
                self.gain.observe_step(self._gain_period(now, seconds), num_reqs, draft_rows,
                                       num_reqs + sum(accepted), drafting=sum(1 for b in budgets if b > 0),
                                       drafter_seconds=self.draft_seconds, overhead_seconds=self.spec_overhead)
        if query > 0 and self.policy.learns:
            self.policy.observe(query_tokens=query, step_seconds=seconds, budgets=budgets,
                                accepted=accepted, drafted=drafted, drafter_seconds=self.draft_seconds)

    def _gain_period(self, now: float, seconds: float) -> float:
        """What budget.gain prices a decode step by: its whole period since the last drafts were
        returned, drafting excluded (counted apart), since the engine core's scheduling and
        output handling between worker steps is part of what every step costs (vLLM runs custom
        proposers, and every server on CPU, without async scheduling); the step's own `seconds`
        when there was no last drafting call or it lies far back (an idle gap)."""
        period = now - self.last_propose_end if self.last_propose_end is not None else seconds
        return period if period < IDLE_GAP_FACTOR * seconds else seconds

    def _guard_step(self, period: float | None, num_reqs: int, accepted: list[int]) -> None:
        """Feed the guard one step: its whole period (drafting call to drafting call; None when
        not a pure decode step, which it does not count) and the tokens it emitted; log a
        verdict that changes drafting."""
        guard = self.guard
        was, tests = guard.verdict, guard.tests
        guard.step(period, num_reqs + sum(accepted), num_reqs)
        if self._tensor_parallel:
            # the guard times each rank's own steps: rank 0's verdict holds on every rank, so all
            # tensor-parallel ranks draft the same trees (every rank observes every step)
            guard.allows = bool(_broadcast_from_first_rank(int(guard.allows)))
        verdict = guard.verdict
        if guard.tests != tests and verdict is not None and (was is None or was.allows != verdict.allows):
            logger.info("TreeProposer: drafting %s at %.1f decoding requests: drafted steps emitted "
                        "%.2fx the tokens per second of paused ones (budget.gain.guard)",
                        "allowed" if verdict.allows else "paused", verdict.batch, verdict.ratio)
        shown = (verdict.ratio if verdict is not None else None, guard.allows)
        if shown != self._guard_shown:       # (on change only: the gauges hold their last value)
            self._guard_shown = shown
            self.stats.observe_guard(*shown)


@dataclass
class _QuietStretch:
    """Steps in which no request of an unchanged batch can draft: budget.gain settles each
    without a full decision or the guard's pause keeps it out (`BudgetControl._quiet_stretch`)."""
    req_ids: list[str]          # the batch, in the runner's order
    members: list[Any]          # per request its record (engine/request_table.py), same order
    settled: list[Any]          # ... those budget.gain decides each step (the rest the guard pauses)
    steps: int                  # steps of the stretch still ahead
    chosen: int                 # the fixed policy's node budget (counted per step)
    allows: bool                # the guard's verdict the stretch holds under (True without a guard)
    done: int = 0               # steps skipped so far, decided and counted by `end_quiet`
    # per step `take_quiet_step` took: (its period for budget.gain's cost, its period for the guard
    # (None: none before it), its worker-step seconds), observed by `_replay_quiet_observations`
    observed: list[tuple[float, float | None, float]] = field(default_factory=list)

    def take_step(self) -> None:
        """One more step skipped."""
        self.steps -= 1
        self.done += 1


def _guard_period(now: float, last: float | None, seconds: float) -> float | None:
    """A step's whole period for the guard (from the last observed step to this one), or None
    (not counted) when there is no last step or the period spans an idle gap
    (`IDLE_GAP_FACTOR`, as budget.gain's `_gain_period` tells one). Why: a step after
    an idle gap would charge the gap to whichever side of a guard test it fell in, so traffic
    with gaps between requests flipped the guard's verdicts on nothing but the gaps (at one
    sampled client that cost the default its margin over its plain-step floor,
    `bench_paired_plain_floor_vs_default{,_gap_filtered}_t07_c1_code-lm.json`)."""
    if last is None:
        return None
    period = now - last
    return period if period < IDLE_GAP_FACTOR * seconds else None


def _broadcast_from_first_rank(value: int) -> int:
    """`value` of tensor-parallel rank 0, on every rank (a one-integer broadcast on the CPU group)."""
    import torch.distributed as dist
    from vllm.distributed.parallel_state import get_tp_group

    group = get_tp_group()
    if group.world_size == 1:
        return value
    t = torch.tensor([value], dtype=torch.int64)
    dist.broadcast(t, src=group.ranks[0], group=group.cpu_group)
    return int(t.item())
