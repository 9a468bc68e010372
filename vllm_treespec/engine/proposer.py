"""TreeProposer: the class vLLM instantiates for
`--speculative-config '{"model": "vllm_treespec.TreeProposer", ...}'` (method `custom_class`).

One instance lives in each worker process (every tensor-parallel rank drafts the same trees from
the same inputs; only the output rank's drafts reach the scheduler). Constructing it activates
the plugin (version check, runner patches, tree attention backend), loads and validates the
deployment config from `--additional-config`, and builds the configured drafter.

Per step, driven by the runner patches (engine/runner_patches.py):
1. `propose_step` (after sampling): budgets per request, trees from the drafter, the tree kept
   per request id, its node tokens returned to vLLM as the request's draft tokens;
2. `plan_step` (in `_prepare_inputs` of the next step): the scheduled drafts matched to those
   trees -> a `TreeStep` (positions, masks, logits rows) for attention and sampling;
3. `sample` (instead of vLLM's rejection sampler): tree acceptance, KV compaction, statistics.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

import numpy as np
import torch

from vllm_treespec.budget import make_budget_policy
from vllm_treespec.budget.gain import GAIN_DECISIONS, GainControl, decision_kind, gain_class
from vllm_treespec.budget.reach import SAMPLED, ReachCap
from vllm_treespec.config import TreespecConfig, from_additional_config
from vllm_treespec.drafters import DraftInputs, make_drafter
from vllm_treespec.drafters.base import TargetStates
from vllm_treespec.engine.eligibility import pending_min_tokens, static_blocker
from vllm_treespec.engine.metrics import make_metrics
from vllm_treespec.engine.request_options import RequestOptionError, parse_request_options
from vllm_treespec.engine.tree_step import TreeStep, plan_tree_step
from vllm_treespec.engine.tree_stats import TreeStats
from vllm_treespec.tree import DraftTree

from vllm.logger import init_logger

logger = init_logger(f"vllm.{__name__}")


@dataclass
class RequestStats:
    """Per-request drafting statistics (freed when the request finishes or is aborted)."""
    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    blocker: str | None = None          # request option that keeps it from drafting (fixed)
    options_checked: bool = False       # `blocker` computed from the request's SamplingParams
    max_nodes: int | None = None        # the request's own cap (extra_args treespec.max_nodes)
    seeded_sampled: bool = False        # its tokens depend on its trees (budget/gain.py)
    gain_class: str | None = None       # unseeded sampled: its class for budget.gain's priors
    fallback_steps: dict[str, int] = field(default_factory=dict)


class TreeProposer:
    def __init__(self, vllm_config: Any) -> None:
        from vllm_treespec.engine import activate

        activate()
        spec = vllm_config.speculative_config
        self.num_speculative_tokens = int(spec.num_speculative_tokens)
        self.config: TreespecConfig = from_additional_config(
            vllm_config.additional_config, self.num_speculative_tokens)
        if self.config.tree.builder != "chain":
            # before the runner builds the model: its layers read the backend from this config
            from vllm_treespec.engine.backend_choice import select_tree_backend

            select_tree_backend(vllm_config)
        self.node_budget = self.config.node_budget(self.num_speculative_tokens)
        # load-dependent budgets (budget.mode): chosen per step from the decoding batch size
        self.budget_policy = make_budget_policy(self.config.budget, self.num_speculative_tokens)
        self._budget_given: dict[str, int] = {}      # req id -> node budget of its current drafts
        # budget.reach_floor: no deeper than each request accepts with that probability
        # (budget/reach.py); its sampling class (greedy / sampled) for the stats
        floor = self.config.budget.reach_floor
        self.reach = ReachCap(floor, max_depth=self.node_budget) if floor > 0 else None
        self._reach_class: dict[str, str] = {}
        # budget.gain: each request drafts only what pays at the current load (budget/gain.py)
        gain = self.config.budget.gain
        self.gain = GainControl(
            self.node_budget, probe_every=gain.probe_every, max_probe_every=gain.max_probe_every,
            probe_nodes=gain.probe_nodes, fixed_row_cost=gain.fixed_row_cost,
            fixed_request_cost=gain.fixed_request_cost, margin=gain.margin,
            calibrate_every=gain.calibrate_every) if gain.enabled else None
        # the last verified step's (budgets, accepted, drafted) per tree, for the policy's observe
        self._verified: tuple[list[int], list[int], list[int]] | None = None
        self._draft_seconds = 0.0
        # auto budgets depend on each rank's own timings: rank 0's choice is broadcast every step
        # so all tensor-parallel ranks draft the same trees
        self._sync_budget = (self.config.budget.mode == "auto"
                             and int(vllm_config.parallel_config.tensor_parallel_size) > 1)
        sched = vllm_config.scheduler_config
        self._max_verify_tokens = min(int(sched.max_num_batched_tokens),
                                      int(sched.max_num_seqs) * (1 + self.node_budget))
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        tokenizer = vllm_config.model_config.tokenizer
        if self.config.drafter.type == "draft_model" and vllm_config.model_config.skip_tokenizer_init:
            logger.warning("TreeProposer: skip_tokenizer_init is set, so the draft model's tokenizer "
                           "cannot be compared with the served model's; token ids are taken as shared")
            tokenizer = None
        self.drafter = make_drafter(self.config.drafter, tokenizer,
                                    self.config.tree, max_model_len=self.max_model_len,
                                    max_nodes=self.node_budget,
                                    vocab_limit=vllm_config.model_config.get_vocab_size())
        self.requests: dict[str, RequestStats] = {}
        self.trees: dict[str, DraftTree] = {}
        self.draft_probs: dict[str, Any] = {}   # req id -> DraftProbs of its sampled tree (rrs)
        # req id -> tree acceptance's own generator of a seeded request (not vLLM's; see `sample`)
        self.generators: dict[str, torch.Generator] = {}
        self.stats = TreeStats(self.num_speculative_tokens, metrics=make_metrics(
            getattr(vllm_config.model_config, "served_model_name", None)))   # vLLM's model_name label
        self._last_verified: tuple[TreeStep | None, np.ndarray] = (None, np.zeros((0, 1), dtype=np.int64))
        # a free idle step (no request carried drafts): vLLM ran it as a plain step
        self.plain_step = False
        self._plain_query_start: np.ndarray | None = None     # its query_start_loc [num_reqs + 1]
        self._spec_overhead = 0.0     # the last speculative step's seconds outside the forward
        self._device_kv: Any = None   # CUDA: the runner's KV caches as pointer tables (built once)
        self._last_propose_end: float | None = None    # when the last drafts were returned
        self.step_started_at: float | None = None   # set by the _prepare_inputs patch
        logger.info("TreeProposer: drafter=%s builder=%s budget=%d config=%s", self.drafter.name,
                    self.config.tree.builder, self.node_budget, self.config.source)

    def aux_layers(self) -> tuple[int, ...]:
        """vLLM aux-hidden-state layer ids the drafter reads (id j = output of layer j - 1); the
        `_setup_eagle3_aux_hidden_state_outputs` patch asks the target for them."""
        return tuple(getattr(self.drafter, "aux_layers", ()) or ())

    # -- lifecycle -------------------------------------------------------------------------
    def load_model(self, target_model: Any, *args: Any, **kwargs: Any) -> None:
        if self.config.tree.builder != "chain":
            from vllm_treespec.engine.model_checks import check_tree_attention

            check_tree_attention(target_model)
        self.drafter.load(target_model)

    def profile_verify_cost(self, runner: Any) -> None:
        """budget.mode auto without budget.auto.profile (and startup_profile on): time the target's
        forward at 1, 2, 4, ... query tokens (engine/verify_profile.py) and seed the policy's cost
        model. Called by the worker patch after vLLM's warm-up, before serving."""
        auto = self.config.budget.auto
        if self.config.budget.mode != "auto" or auto.profile is not None or not auto.startup_profile:
            return
        from vllm_treespec.engine.verify_profile import measure_step_seconds, profile_sizes

        start = time.perf_counter()
        points = measure_step_seconds(runner, profile_sizes(self._max_verify_tokens))
        self.budget_policy.cost.seed(points)
        logger.info("TreeProposer: verify cost profiled in %.1f s (query tokens -> ms): %s",
                    time.perf_counter() - start, ", ".join(f"{q}: {s * 1e3:.2f}" for q, s in points))

    def on_requests_finished(self, req_ids: Iterable[str], runner: Any = None) -> None:
        """Free state of finished/aborted requests; drafters that learn online see their outputs.

        Called (by the `_update_states` patch) before vLLM removes the requests from its batch,
        so their rows in the token buffer are still readable.
        """
        req_ids = list(req_ids)
        for table in self._request_tables():
            for req_id in req_ids:
                table.pop(req_id, None)
        if self.reach is not None:
            self.reach.release(req_ids)
        if self.gain is not None:
            self.gain.release(req_ids)
        observe = getattr(self.drafter, "observe_output", None)
        if observe is not None and runner is not None:
            batch = runner.input_batch
            for req_id in req_ids:
                i = batch.req_id_to_index.get(req_id)
                if i is not None:
                    observe(batch.token_ids_cpu[i, batch.num_prompt_tokens[i]: batch.num_tokens_no_spec[i]])
        self.drafter.on_requests_finished(req_ids)

    def _request_tables(self) -> tuple[dict[str, Any], ...]:
        """Every table keyed by request id that this object holds; `on_requests_finished` frees
        a request from all of them (and `tracked_requests` reports what is still held)."""
        return (self.requests, self.trees, self.draft_probs, self._budget_given, self._reach_class,
                self.generators)

    def tracked_requests(self) -> dict[str, int]:
        """How many requests each per-request table still holds, the drafter's included (a
        leak check: after every request finished, every count is 0)."""
        names = ("requests", "trees", "draft_probs", "budget_given", "reach_class", "generators")
        counts = {n: len(t) for n, t in zip(names, self._request_tables())}
        if self.reach is not None:
            counts["reach"] = self.reach.tracked()
        if self.gain is not None:
            counts["gain"] = self.gain.tracked()
        for name, n in self.drafter.tracked_requests().items():
            counts[f"drafter.{name}"] = n
        return counts

    @staticmethod
    def _cached(runner: Any, req_id: str) -> Any:
        """vLLM's CachedRequestState of a request (None when the runner has no such request)."""
        return getattr(runner, "requests", {}).get(req_id)

    def _state(self, req_id: str, runner: Any) -> RequestStats:
        st = self.requests.get(req_id)
        if st is None:
            st = self.requests[req_id] = RequestStats()
        return st

    def _output_room(self, runner: Any, req_id: str, num_tokens: int) -> int:
        """Drafts the request can still emit: max_tokens minus its output so far, minus the token
        the next step emits anyway. Deeper nodes would be verified rows whose tokens are cut
        (and counted as accepted by vLLM's spec-decode counters although never emitted)."""
        cached = self._cached(runner, req_id)
        max_tokens = getattr(getattr(cached, "sampling_params", None), "max_tokens", None)
        num_prompt = getattr(cached, "num_prompt_tokens", None)
        if max_tokens is None or num_prompt is None:
            return self.node_budget
        return max(int(max_tokens) - (num_tokens - int(num_prompt)) - 1, 0)

    def _reach_means(self) -> dict[str, float]:
        """Mean reach cap of the live requests of each sampling class (for stats and /metrics)."""
        assert self.reach is not None
        per: dict[str, list[int]] = {}
        for req_id, cls in self._reach_class.items():
            per.setdefault(cls, []).append(self.reach.cap(req_id))
        return {cls: sum(c) / len(c) for cls, c in per.items()}

    def _sampling_class(self, runner: Any, req_id: str) -> str:
        """greedy or sampled (budget/reach.py), from the request's temperature."""
        params = getattr(self._cached(runner, req_id), "sampling_params", None)
        return ReachCap.sampling_class(getattr(params, "temperature", None))

    def blocker(self, req_id: str, runner: Any) -> str | None:
        """Why this request may not be verified as a tree this step (None = it may).

        The fixed options are checked once per request (engine/eligibility.py); only the
        pending min_tokens changes from step to step."""
        st = self._state(req_id, runner)
        cached = self._cached(runner, req_id)
        if cached is None:
            return st.blocker
        if not st.options_checked:
            self._check_options(st, cached.sampling_params)
        if st.blocker is None and pending_min_tokens(cached.sampling_params, len(cached.output_token_ids)):
            return "min_tokens"
        return st.blocker

    @staticmethod
    def _check_options(st: RequestStats, params: Any) -> None:
        """The request's fixed options, read once: what keeps it from drafting, its own node cap
        (extra_args, engine/request_options.py) and whether it samples with a seed."""
        st.blocker, st.options_checked = static_blocker(params), True
        try:
            st.max_nodes = parse_request_options(getattr(params, "extra_args", None)).max_nodes
        except RequestOptionError as e:       # checked at admission; never guess past a bad value
            logger.warning("TreeProposer: %s; the request is served without drafts", e)
            st.max_nodes = 0
        st.seeded_sampled = (getattr(params, "seed", None) is not None and
                             ReachCap.sampling_class(getattr(params, "temperature", None)) == SAMPLED)
        st.gain_class = None if st.seeded_sampled else gain_class(getattr(params, "temperature", None))

    # -- drafting --------------------------------------------------------------------------
    def propose_step(self, runner: Any, scheduler_output: Any, sampled_token_ids: list[list[int]],
                     hidden_states: Any = None, aux_hidden_states: Any = None) -> list[list[int]]:
        """Drafts for every request in the runner's batch (the patched runner calls this)."""
        self._observe_budget(scheduler_output)
        batch = runner.input_batch
        req_ids = list(batch.req_ids)
        scheduled = int(scheduler_output.num_spec_tokens_to_schedule) or self.num_speculative_tokens
        target = None
        if getattr(self.drafter, "uses_target_states", False) and hidden_states is not None:
            rows = self._committed_rows(len(req_ids))
            flat = runner.positions.to("cpu").numpy()       # this step's positions (tree rows: + depth)
            target = TargetStates(hidden_states, aux_hidden_states, rows, [flat[r] for r in rows])
        drafts = self._propose(runner, req_ids, sampled_token_ids, batch.num_tokens_no_spec,
                               batch.token_ids_cpu, min(self.node_budget, scheduled), target)
        if self.step_started_at is not None:
            self.stats.observe_step(time.perf_counter() - self.step_started_at)
            self.step_started_at = None
        self._last_propose_end = time.perf_counter()
        return drafts

    def _observe_budget(self, scheduler_output: Any) -> None:
        """Tell the budget policy what the step that just ran cost and how much it accepted:
        target seconds from `_prepare_inputs` to here (forward + verification), the previous
        drafting time, and per verified tree its budget, accepted and drafted nodes."""
        if self.step_started_at is None:
            self._verified = None
            return
        now = time.perf_counter()
        seconds = now - self.step_started_at
        query = int(getattr(scheduler_output, "total_num_scheduled_tokens", 0) or 0)
        budgets, accepted, drafted = self._verified or ([], [], [])
        self._verified = None
        if self.gain is not None and query > 0:
            # budget.gain prices a step by its whole period, drafting excluded (counted apart):
            # the engine core's scheduling and output handling between worker steps is part of
            # what every step costs (vLLM runs speculative configs without async scheduling)
            period = now - self._last_propose_end if self._last_propose_end is not None else seconds
            self._observe_gain_step(scheduler_output, query, period if period < 20 * seconds else seconds,
                                    accepted, budgets)
        if query > 0:
            self.budget_policy.observe(query_tokens=query, step_seconds=seconds, budgets=budgets,
                                       accepted=accepted, drafted=drafted,
                                       drafter_seconds=self._draft_seconds)

    def _observe_gain_step(self, scheduler_output: Any, query: int, seconds: float,
                           accepted: list[int], budgets: list[int]) -> None:
        """budget.gain learns step costs from decode steps only (a prompt chunk's rows cost
        differently): query rows = one per request plus the scheduled drafts."""
        drafts = scheduler_output.scheduled_spec_decode_tokens
        num_reqs = len(scheduler_output.num_scheduled_tokens)
        if query != num_reqs + sum(len(d) for d in drafts.values()):
            return
        self.gain.observe_step(seconds, query, bool(drafts), num_reqs + sum(accepted),
                               drafting=sum(1 for b in budgets if b > 0),
                               drafter_seconds=self._draft_seconds,
                               overhead_seconds=self._spec_overhead)

    def _committed_rows(self, num_reqs: int) -> list[np.ndarray]:
        """Flat step rows of each request's committed tokens (see drafters.base.TargetStates)."""
        step, accepted = self._last_verified
        if step is None:
            qsl = self._plain_query_start
            if qsl is None or qsl.size != num_reqs + 1:
                return [np.zeros(0, dtype=np.int64)] * num_reqs
            return [np.arange(qsl[i], qsl[i + 1], dtype=np.int64) for i in range(num_reqs)]
        qsl = step.query_start_loc
        rows = [np.arange(qsl[i], qsl[i + 1], dtype=np.int64) for i in range(step.num_reqs)]
        for j, i in enumerate(step.req_indices.tolist()):    # trees: root + accepted path only
            path = accepted[j][accepted[j] >= 0]
            rows[i] = qsl[i] + np.concatenate([[0], path]).astype(np.int64)
        return rows

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        """vLLM's stock `custom_class` entry point (unused while the runner patch is installed)."""
        req_ids = [f"#{i}" for i in range(len(sampled_token_ids))]
        return self._propose(None, req_ids, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                             self.node_budget)

    def _propose(self, runner: Any, req_ids: list[str], sampled_token_ids: list[list[int]],
                 num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                 budget: int, target: TargetStates | None = None) -> list[list[int]]:
        start = time.perf_counter()
        n = len(req_ids)
        num_tokens = np.asarray(num_tokens_no_spec[:n], dtype=np.int64)
        # plain Python for the per-request scalars: a step has few requests, and each numpy
        # call costs microseconds with the caches cold from the forward pass
        lengths = num_tokens.tolist()
        decoding = [len(s) > 0 for s in sampled_token_ids[:n]]
        active = [t for t, d in zip(lengths, decoding) if d]
        choice = self.budget_policy.choose(len(active), sum(active) // len(active) if active else 0)
        chosen = _broadcast_from_first_rank(choice.nodes) if self._sync_budget else choice.nodes
        if active:
            self.stats.observe_budget_choice(chosen)
        budget = min(budget, chosen)
        caps = [min(budget, max(self.max_model_len - t, 0)) if d else 0 for t, d in zip(lengths, decoding)]
        gain_costs = None     # budget.gain's row and request costs, once per step
        gain_counts: dict[str, int] = {}
        if self.gain is not None:
            self.gain.begin_step()
        for i, cap in enumerate(caps):
            if cap:
                reason = self.blocker(req_ids[i], runner)
                if reason is not None:
                    caps[i] = 0
                    fb = self.requests[req_ids[i]].fallback_steps
                    fb[reason] = fb.get(reason, 0) + 1
                    self.stats.observe_fallback(reason)
                else:
                    st = self.requests[req_ids[i]]
                    caps[i] = min(cap, self._output_room(runner, req_ids[i], lengths[i]))
                    if st.max_nodes is not None:
                        caps[i] = min(caps[i], st.max_nodes)
                    if self.reach is not None:
                        self._reach_class[req_ids[i]] = self._sampling_class(runner, req_ids[i])
                        caps[i] = min(caps[i], self.reach.cap(req_ids[i]))
                    if self.gain is not None and caps[i] > 0:
                        if gain_costs is None:
                            gain_costs = self.gain.measured_costs()
                            gain_counts = dict.fromkeys(GAIN_DECISIONS, 0)
                        decision = self.gain.decide(req_ids[i], caps[i], st.seeded_sampled,
                                                    gain_costs, st.gain_class)
                        caps[i] = decision.nodes
                        gain_counts[decision_kind(decision, self.gain.calibrating)] += 1
        if gain_costs is not None:
            self.stats.observe_gain(gain_counts, gain_costs, self.gain.cost.coefficients())
        if not any(caps) and not getattr(self.drafter, "uses_target_states", False):
            return self._propose_nothing(runner, req_ids, decoding, caps, start)
        budgets = np.array(caps, dtype=np.int64)
        sampling = None
        if getattr(self.drafter, "samples_drafts", False):
            cached = [self._cached(runner, r) if runner is not None else None for r in req_ids]
            sampling = [c.sampling_params if c is not None else None for c in cached]
        inputs = DraftInputs(req_ids=req_ids, token_ids=token_ids_cpu, rows=np.arange(n, dtype=np.int64),
                             num_tokens=num_tokens, budgets=budgets, target=target, sampling=sampling,
                             tree_overrides=choice.tree_params({}))   # a table rule's tree keys
        trees = self.drafter.propose(inputs)     # head caches take every step's committed rows
        probs = getattr(self.drafter, "last_draft_probs", None) or {}
        drafts: list[list[int]] = []
        for i, (req_id, tree) in enumerate(zip(req_ids, trees)):
            self.draft_probs.pop(req_id, None)
            if tree.num_draft:
                self.trees[req_id] = tree
                drafts.append(tree.draft_token_ids())
                if i in probs:
                    self.draft_probs[req_id] = probs[i]
            else:
                self.trees.pop(req_id, None)
                drafts.append([])
            if decoding[i]:
                st = self._state(req_id, runner)
                st.steps += 1
                st.drafted += tree.num_draft
                self._budget_given[req_id] = caps[i]
        self._draft_seconds = time.perf_counter() - start
        self.stats.observe_draft(self._draft_seconds, [c for c, d in zip(caps, decoding) if d], trees)
        return drafts

    def _propose_nothing(self, runner: Any, req_ids: list[str], decoding: list[bool],
                         caps: list[int], start: float) -> list[list[int]]:
        """No request drafts this step: no drafter call and no trees, so the next step is a
        free idle step (runner_patches: vLLM's plain path)."""
        for req_id, d in zip(req_ids, decoding):
            self.trees.pop(req_id, None)
            self.draft_probs.pop(req_id, None)
            if d:
                self._state(req_id, runner).steps += 1
                self._budget_given[req_id] = 0
        self._draft_seconds = time.perf_counter() - start
        self.stats.observe_draft(self._draft_seconds, [c for c, d in zip(caps, decoding) if d], ())
        return [[] for _ in req_ids]

    # -- verification ------------------------------------------------------------------------
    def plan_plain_step(self, query_start_loc: np.ndarray) -> None:
        """A step in which no request carries drafts runs as vLLM's plain step (the
        `_prepare_inputs` patch): nothing to plan; every scheduled row is committed."""
        self.plain_step = True
        self._plain_query_start = np.array(query_start_loc, dtype=np.int64)
        self._last_verified = (None, np.zeros((0, 1), dtype=np.int64))

    def sample_plain(self, runner: Any, logits: Any, vllm_sample: Callable[[], Any]) -> Any:
        """vLLM's plain sampler output for a free idle step, with the tokens of seeded sampled
        requests re-drawn by tree acceptance from their own generators (root-only trees): such
        a request draws from the same stream whether or not other requests in its steps
        drafted, so its tokens do not depend on other traffic. Others keep vLLM's token."""
        from vllm_treespec.engine.runner_state import discarded_rows, request_sampling
        from vllm_treespec.engine.tree_verifier import SAMPLING_EPS, acceptance_generators, verify_step

        from vllm.v1.outputs import SamplerOutput

        qsl = self._plain_query_start
        num_reqs = int(qsl.size - 1)
        batch_ids = list(runner.input_batch.req_ids)[:num_reqs]
        params = request_sampling(runner, batch_ids)
        discarded = discarded_rows(runner, num_reqs)
        rows = [i for i, p in enumerate(params)
                if p.seed is not None and float(p.temperature) >= SAMPLING_EPS and not discarded[i]
                and self.blocker(batch_ids[i], runner) is None]
        if not rows:
            return vllm_sample()
        include = np.asarray(rows, dtype=np.int64)
        own_logits = logits[torch.from_numpy(include)].clone()    # vLLM's sampler edits logits in place
        out = vllm_sample()
        ids = [batch_ids[i] for i in rows]
        sub = [params[i] for i in rows]
        step = plan_tree_step(ids, np.ones(len(rows), dtype=np.int64), {}, {},
                              np.arange(len(rows) + 1, dtype=np.int64),
                              runner.input_batch.num_computed_tokens_cpu[include])
        gens = acceptance_generators(self.generators, ids, sub, getattr(runner, "device", "cpu"))
        tokens, _ = verify_step(step, own_logits, sub, gens, None, None,
                                coin_rows=self.num_speculative_tokens + 1)
        sampled = out.sampled_token_ids.clone()
        sampled[torch.from_numpy(include)] = tokens.to(sampled.dtype)
        return SamplerOutput(sampled_token_ids=sampled, logprobs_tensors=out.logprobs_tensors)

    def plan_step(self, batch_req_ids: list[str], num_scheduled: np.ndarray,
                  scheduled_drafts: dict[str, list[int]], query_start_loc: np.ndarray,
                  num_computed: np.ndarray) -> TreeStep:
        """Match the scheduled drafts to our trees (see engine/tree_step.py)."""
        self.plain_step = False
        step = plan_tree_step(batch_req_ids, num_scheduled, scheduled_drafts, self.trees,
                              query_start_loc, num_computed, self.draft_probs)
        # committed rows of this step for drafters reading target states: every scheduled row
        # until `sample` (tree steps) narrows tree requests to their accepted path
        self._last_verified = (step, np.full((step.num_trees, 1), -1, dtype=np.int64))
        return step

    def sample(self, runner: Any, step: TreeStep, logits: Any,
               vllm_sample: Callable[[], Any]) -> Any:
        """vLLM's SamplerOutput for the step: every request trees can serve exactly is sampled
        by tree acceptance (root-only trees for those without drafts), the rest by vLLM.

        Tree acceptance draws a seeded request's coins from `self.generators` (its own stream,
        seeded like vLLM's), never from vLLM's generator, which vLLM's sampler advances in mixed
        steps: so a seeded request samples the same tokens whatever shares its steps."""
        from vllm_treespec.engine import device_verify
        from vllm_treespec.engine.runner_state import (device_kv, discarded_rows,
                                                       kv_caches_and_layout, request_sampling)
        from vllm_treespec.engine.tree_verifier import (GREEDY, acceptance_generators, compact,
                                                        compact_device, count_moves, verify_step)

        from vllm.v1.outputs import SamplerOutput

        start = time.perf_counter()
        batch_ids = list(runner.input_batch.req_ids)[:step.num_reqs]
        if step.num_trees == step.num_reqs and not step.has_foreign_drafts:
            include = None                     # every request drafted: all are verified as trees
        else:
            ours = np.fromiter((self.blocker(r, runner) is None for r in batch_ids), dtype=bool,
                               count=step.num_reqs)
            ours[step.req_indices] = True      # drafted trees are always verified as trees
            ours[step.foreign] = False         # vLLM's own padding drafts stay with vLLM
            include = None if ours.all() else np.nonzero(ours)[0]
        own = include is None
        base, logprobs = None, None
        if not own:
            out = vllm_sample()
            base, logprobs = out.sampled_token_ids, out.logprobs_tensors
            if include.size == 0:
                return out
        rows = range(step.num_reqs) if own else include.tolist()
        ids = [batch_ids[i] for i in rows]
        params = request_sampling(runner, ids)
        # partial prefills: their token is discarded; sample it greedily so no seeded stream moves
        discarded = discarded_rows(runner, step.num_reqs)
        if discarded.any():
            for j in np.nonzero(discarded[np.asarray(rows, dtype=np.int64)])[0].tolist():
                params[j] = GREEDY
        gens = acceptance_generators(self.generators, ids, params, getattr(runner, "device", "cpu"))
        tokens, result = verify_step(step, logits, params, gens, include, base,
                                     coin_rows=self.num_speculative_tokens + 1)
        accepted_at = time.perf_counter()
        tree_rows = None                        # rows of the step's trees in the result
        if include is not None or step.num_trees != step.num_reqs:
            tree_rows = step.req_indices if include is None else np.searchsorted(include, step.req_indices)
        moved = 0
        compact_start = time.perf_counter()
        on_device = device_verify.wanted(logits)   # CUDA: logits, caches and slots live there
        # chain-shaped steps cannot move K/V (TreeStep.chain_shaped): no cache scan at all
        if on_device and not step.chain_shaped and step.num_trees:
            # CUDA: compaction is queued on the device before anything is read back
            nodes = result.accepted_nodes.to(logits.device)
            if tree_rows is not None:
                nodes = nodes[torch.from_numpy(tree_rows).to(nodes.device)]
            self._device_kv = device_kv(runner, self._device_kv)
            compact_device(step, nodes, self._device_kv)
        # numpy from here: a few tiny arrays per step, where torch's per-op cost dominated
        accepted_nodes = result.accepted_nodes.cpu().numpy()
        if tree_rows is not None:
            accepted_nodes = accepted_nodes[tree_rows]
        accepted_len = (accepted_nodes >= 0).sum(axis=1).tolist()
        self._last_verified = (step, accepted_nodes)
        if on_device:
            moved = count_moves(step, accepted_nodes) if not step.chain_shaped else 0
        elif not step.chain_shaped and any(accepted_len):
            caches, layout = kv_caches_and_layout(runner)
            moved = compact(step, accepted_nodes, caches, layout)
        compacted = time.perf_counter() - compact_start
        sizes = (step.tree_sizes - 1).tolist()
        for req_id, a in zip(step.req_ids, accepted_len):
            st = self.requests.get(req_id)
            if st is not None:
                st.accepted += a
        self._verified = ([self._budget_given.get(r, 0) for r in step.req_ids], accepted_len, sizes)
        if (self.reach is not None or self.gain is not None) and step.num_trees:
            offsets = step.trees.offsets.numpy()
            depths = np.maximum.reduceat(step.trees.depth.numpy(), offsets[:-1]).tolist()
            if self.reach is not None:
                self.reach.observe(step.req_ids, depths, accepted_len)
                self.stats.observe_reach(self._reach_means())
            if self.gain is not None:
                self.gain.observe_trees(step.req_ids, depths, accepted_len)
        # the speculative step's own cost beyond the forward (budget.gain prices drafting with it)
        self._spec_overhead = (time.perf_counter() - start + step.plan_seconds
                               + (step.attn.seconds if step.attn is not None else 0.0))
        if step.num_trees:
            parts = (accepted_at - start, compacted, step.attn.seconds if step.attn is not None else 0.0)
            self.stats.observe_verify(time.perf_counter() - start, sizes, accepted_len, moved, own, parts)
        return SamplerOutput(sampled_token_ids=tokens, logprobs_tensors=logprobs)


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
