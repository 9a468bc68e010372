"""TreeProposer: the class vLLM instantiates for
`--speculative-config '{"model": "vllm_treespec.TreeProposer", ...}'` (method `custom_class`).

One instance lives in each worker process (every tensor-parallel rank drafts the same trees from
the same inputs; only the output rank's drafts reach the scheduler). Constructing it activates
the plugin (version check, runner patches, tree attention backend), loads and validates the
deployment config from `--additional-config`, and builds the configured drafter.

Per step, driven by the runner patches (engine/runner_patches.py):
1. `propose_step` (after sampling): node caps per request (engine/budget_control.py), trees from
   the drafter, kept per request (engine/request_table.py), their node tokens returned to vLLM as
   the request's draft tokens;
2. `plan_step` (in `_prepare_inputs` of the next step): the scheduled drafts matched to those
   trees -> a `TreeStep` (positions, masks, logits rows) for attention and sampling;
3. `sample` (instead of vLLM's rejection sampler): tree acceptance and KV compaction
   (engine/step_sampling.py), then what the budget rules and statistics learn from it.
A step of budget.gain's quiet stretch (nobody can draft in it) is plain for vLLM and takes only
`takes_quiet_step` and `take_quiet_step` here (engine/budget_control.py says what the stretch is).
vLLM's runner is read only through engine/runner_state.py.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from vllm_treespec.config import TreespecConfig, from_additional_config
from vllm_treespec.drafters import DraftInputs, Proposal, make_drafter
from vllm_treespec.drafters.base import TargetStates
from vllm_treespec.engine import runner_state
from vllm_treespec.engine.budget_control import BudgetControl
from vllm_treespec.engine.committed_rows import CommittedRows
from vllm_treespec.engine.metrics import make_metrics
from vllm_treespec.engine.plain_sampling import sample_plain_step
from vllm_treespec.engine.request_table import RequestTable
from vllm_treespec.engine.step_sampling import TreeStepSampler
from vllm_treespec.engine.tree_stats import TreeStats
from vllm_treespec.engine.tree_step import TreeStep, plan_tree_step

from vllm.logger import init_logger

logger = init_logger(f"vllm.{__name__}")


class TreeProposer:
    def __init__(self, vllm_config: Any) -> None:
        from vllm_treespec.engine import activate

        activate()
        self.num_speculative_tokens = k = int(vllm_config.speculative_config.num_speculative_tokens)
        self.config: TreespecConfig = from_additional_config(vllm_config.additional_config, k)
        if self.config.tree.builder != "chain":
            # before the runner builds the model: its layers read the backend from this config
            from vllm_treespec.engine import activate_tree_attention
            from vllm_treespec.engine.backend_choice import select_tree_backend

            activate_tree_attention()
            select_tree_backend(vllm_config)
        self.node_budget = self.config.node_budget(k)
        model = vllm_config.model_config
        # vLLM's model_name label
        self.stats = TreeStats(k, metrics=make_metrics(getattr(model, "served_model_name", None)))
        self.budget = BudgetControl(self.config, k, self.stats, vllm_config)
        tokenizer = model.tokenizer
        if self.config.drafter.type == "draft_model" and model.skip_tokenizer_init:
            logger.warning("TreeProposer: skip_tokenizer_init is set, so the draft model's tokenizer "
                           "cannot be compared with the served model's; token ids are taken as shared")
            tokenizer = None
        self.drafter = make_drafter(self.config.drafter, tokenizer, self.config.tree,
                                    max_model_len=int(model.max_model_len), max_nodes=self.node_budget,
                                    vocab_limit=model.get_vocab_size())
        self.budget.use_drafter(self.drafter.capabilities)
        self.requests = RequestTable()
        self.committed = CommittedRows()      # what the last step committed (target-state drafters)
        self.sampler = TreeStepSampler(coin_rows=k + 1)
        self.plain_step = False               # a free idle step: vLLM runs it as a plain step
        self.drafted = False                  # whether the last propose_step drafted any node
        # quiet steps sampled as vLLM's plain step hide the speculative config from the sample
        # call; for hybrid (Mamba) targets that call also tracks accepted tokens per request
        self.samples_quiet_steps_plainly = not getattr(model, "is_hybrid", False)
        self.plan: TreeStep | None = None     # the tree step between `_prepare_inputs` and `_sample`
        self.step_started_at: float | None = None   # set by the _prepare_inputs patch
        logger.info("TreeProposer: drafter=%s builder=%s budget=%d config=%s", self.drafter.name,
                    self.config.tree.builder, self.node_budget, self.config.source)

    # -- lifecycle -------------------------------------------------------------------------
    def load_model(self, target_model: Any, *args: Any, **kwargs: Any) -> None:
        if self.config.tree.builder != "chain":
            from vllm_treespec.engine.model_checks import check_tree_attention

            check_tree_attention(target_model)
        self.drafter.load(target_model)

    def profile_verify_cost(self, runner: Any) -> None:
        """Called by the worker patch after vLLM's warm-up, before serving (budget.mode auto)."""
        self.budget.profile_verify_cost(runner)

    def on_requests_finished(self, req_ids: Iterable[str], runner: Any = None) -> None:
        """The one place a request's state is freed (its record, budget state included, and the
        drafter's); drafters that learn online see the outputs. Called by the `_update_states`
        patch before vLLM removes the requests from its batch, so their token rows are readable."""
        req_ids = list(req_ids)
        self.budget.end_quiet(self.requests)      # its counts include the finished requests
        self.requests.release(req_ids)
        if self.drafter.capabilities.observes_output and runner is not None:
            for tokens in runner_state.finished_outputs(runner, req_ids):
                self.drafter.observe_output(tokens)
        self.drafter.on_requests_finished(req_ids)
        if not len(self.requests):
            self.stats.flush_metrics()       # idle: /metrics shows everything (metrics are buffered)

    def tracked_requests(self) -> dict[str, int]:
        """Requests still held: records (with their budget rules' state; the rules keep none of
        their own) and the drafter's tables (a leak check: after every request finished, every
        count is 0)."""
        drafter = {f"drafter.{name}": n for name, n in self.drafter.tracked_requests().items()}
        return {"requests": len(self.requests), **drafter}

    # -- drafting --------------------------------------------------------------------------
    def propose_step(self, runner: Any, scheduler_output: Any, sampled_token_ids: list[list[int]],
                     hidden_states: Any = None, aux_hidden_states: Any = None) -> list[list[int]]:
        """Drafts for every request in the runner's batch (the patched runner calls this)."""
        self.budget.observe_step(scheduler_output, self.step_started_at)
        req_ids, token_ids, num_tokens = runner_state.batch_tokens(runner)
        scheduled = int(scheduler_output.num_spec_tokens_to_schedule) or self.num_speculative_tokens
        target = None
        if self.drafter.capabilities.uses_target_states and hidden_states is not None:
            rows = self.committed.rows(len(req_ids))
            flat = runner_state.step_positions(runner)       # tree rows: num_computed + depth
            target = TargetStates(hidden_states, aux_hidden_states, rows, [flat[r] for r in rows])
        drafts = self._propose(runner, req_ids, sampled_token_ids, num_tokens, token_ids,
                               min(self.node_budget, scheduled), target)
        if self.step_started_at is not None:
            self.stats.observe_step(time.perf_counter() - self.step_started_at)
            self.step_started_at = None
        self.budget.last_propose_end = time.perf_counter()
        return drafts

    def takes_quiet_step(self, runner: Any, scheduler_output: Any) -> bool:
        """Before vLLM samples a plain step: whether the step is certainly one of budget.gain's
        quiet stretch (`BudgetControl.quiet_ahead`). Then the runner patch samples it as vLLM's
        plain step, without vLLM's drafting path or this proposer's `propose_step`, and calls
        `take_quiet_step`."""
        return (self.plain_step and self.samples_quiet_steps_plainly
                and self.budget.quiet_ahead(scheduler_output, self.step_started_at, runner_state.live_req_ids(runner)))

    def take_quiet_step(self, sampled_token_ids: Sequence[Sequence[int]]) -> None:
        """The quiet step `takes_quiet_step` announced has been sampled (`sampled_token_ids`: per
        request its new tokens): nobody drafts in it, and what it teaches budget.gain is observed
        when the stretch ends. A request that sampled nothing (a prompt chunk, which a stretch's
        batch of decoding requests cannot hold, but checked after the fact since the check is
        cheaper here) ends the stretch instead, this step unobserved."""
        if all(sampled_token_ids):
            self.budget.take_quiet_step(self.step_started_at)
        else:
            self.budget.end_quiet(self.requests)
        self.drafted = False
        self.step_started_at = None

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
                token_ids_cpu: np.ndarray, slot_mappings: Any = None) -> list[list[int]]:
        """vLLM's stock `custom_class` entry point (unused while the runner patch is installed)."""
        req_ids = [f"#{i}" for i in range(len(sampled_token_ids))]
        return self._propose(None, req_ids, sampled_token_ids, num_tokens_no_spec, token_ids_cpu,
                             self.node_budget)

    def _propose(self, runner: Any, req_ids: list[str], sampled_token_ids: list[list[int]],
                 num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                 budget: int, target: TargetStates | None = None) -> list[list[int]]:
        n = len(req_ids)
        if self.budget.quiet_step(req_ids, sampled_token_ids):
            # budget.gain knows nobody can draft in this step (engine/budget_control.py, the quiet
            # stretch): no drafts, and the step's decisions are made when the stretch ends
            self.drafted = False
            self.budget.draft_seconds = 0.0
            return [[] for _ in range(n)]
        start = time.perf_counter()
        # plain Python for the per-request scalars: a step has few requests, and each numpy
        # call costs microseconds with the caches cold from the forward pass
        lengths = np.asarray(num_tokens_no_spec[:n]).tolist()
        decoding = [len(s) > 0 for s in sampled_token_ids[:n]]
        self.budget.settle_shadow_probes(self.requests, req_ids, token_ids_cpu, lengths)
        caps, choice = self.budget.caps(self.requests, runner, req_ids, lengths, decoding, budget)
        wants = self.drafter.capabilities
        proposal: Proposal | None = None     # None: nobody drafts, no drafter call (a free idle step)
        if any(caps) or wants.uses_target_states:     # head caches take every step's committed rows
            sampling = ([runner_state.request_params(runner, r) for r in req_ids]
                        if wants.samples_drafts or wants.reads_sampling else None)
            proposal = self.drafter.propose(DraftInputs(
                req_ids=req_ids, token_ids=token_ids_cpu, rows=np.arange(n, dtype=np.int64),
                num_tokens=np.asarray(num_tokens_no_spec[:n], dtype=np.int64),
                budgets=np.array(caps, dtype=np.int64), target=target,
                sampling=sampling, tree_overrides=choice.tree_params({})))   # a table rule's tree keys
        self.budget.rate_drafts(self.requests, req_ids, proposal, caps)
        self.budget.keep_shadow_probes(self.requests, req_ids, proposal, caps, lengths)
        drafts = self.requests.record_drafts(req_ids, proposal, decoding, caps)
        self.drafted = any(drafts)
        self.stats.observe_step_kind(self.budget.step_kind(self.drafted, decoding))
        self.budget.draft_seconds = time.perf_counter() - start
        self.stats.observe_draft(self.budget.draft_seconds, [c for c, d in zip(caps, decoding) if d],
                                 proposal.trees if proposal is not None else ())
        return drafts

    # -- verification ------------------------------------------------------------------------
    def plan_plain_step(self, query_start_loc: np.ndarray) -> None:
        """A step in which no request carries drafts runs as vLLM's plain step (the
        `_prepare_inputs` patch): nothing to plan; every scheduled row is committed."""
        self.plain_step = True
        self.committed.plain(query_start_loc)

    def plan_step(self, batch_req_ids: list[str], num_scheduled: np.ndarray,
                  scheduled_drafts: dict[str, list[int]], query_start_loc: np.ndarray,
                  num_computed: np.ndarray) -> TreeStep:
        """Match the scheduled drafts to our trees (see engine/tree_step.py)."""
        self.plain_step = False
        step = plan_tree_step(batch_req_ids, num_scheduled, scheduled_drafts, self.requests.trees,
                              query_start_loc, num_computed, self.requests.draft_probs)
        if step.attn is not None and self.config.tree.builder == "chain":
            # the attention layers run vLLM's causal backend (engine.activate_tree_attention):
            # verifying a branching tree on it would accept tokens the model did not predict
            raise RuntimeError(
                f"treespec: drafter {self.drafter.name!r} returned a branching tree under "
                "tree.builder chain; chain deployments verify on vLLM's causal attention")
        self.committed.planned(step)
        return step

    def sample_plain(self, runner: Any, logits: Any, vllm_sample: Callable[[], Any]) -> Any:
        """vLLM's plain sampler output, seeded sampled requests re-drawn (engine/plain_sampling.py)."""
        return sample_plain_step(runner, logits, vllm_sample, self.committed.plain_query_start, self.requests,
                                 self.num_speculative_tokens + 1)

    def sample(self, runner: Any, step: TreeStep, logits: Any, vllm_sample: Callable[[], Any]) -> Any:
        """vLLM's SamplerOutput for the step (engine/step_sampling.py); what it accepted feeds
        the committed rows, the per-request counts, the budget rules and the statistics."""
        start = time.perf_counter()
        out, verified = self.sampler.sample(runner, step, logits, vllm_sample, self.requests)
        if verified is None:
            return out
        self.committed.verified(step, verified.accepted_nodes)
        sizes = (step.tree_sizes - 1).tolist()
        self.requests.count_accepted(step.req_ids, verified.accepted_len)
        self.budget.observe_verified(self.requests, step, verified.accepted_len, sizes, verified.accepted_nodes)
        attn = step.attn.seconds if step.attn is not None else 0.0
        # the speculative step's own cost beyond the forward (budget.gain prices drafting with it)
        self.budget.spec_overhead = time.perf_counter() - start + step.plan_seconds + attn
        if step.num_trees:
            self.stats.observe_verify(time.perf_counter() - start, sizes, verified.accepted_len, verified.moved,
                                      verified.own, (verified.accept_seconds, verified.compact_seconds, attn))
        return out
