"""Per-worker tree statistics: what was drafted, verified and accepted, and what it cost.

vLLM's own `vllm:spec_decode_*` series already count trees correctly (drafted = nodes scheduled,
accepted = path length, per-position counts = a histogram of accepted depth). These counters add
the tree-specific view (nodes per tree, accepted depth, drafter/verify time, budget, KV moves,
own vs mixed sampling) for logs and tests, and forward each observation to the Prometheus
series (engine/metrics.py) when this worker exports them.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from vllm_treespec.budget.gain import StepCoefficients


__all__ = ["TreeStats"]


@dataclass
class TreeStats:
    max_depth: int
    draft_steps: int = 0
    draft_seconds: float = 0.0
    budget_sum: int = 0
    budget_count: int = 0
    trees: int = 0
    nodes: int = 0
    verify_steps: int = 0
    verify_seconds: float = 0.0
    accept_seconds: float = 0.0
    compaction_seconds: float = 0.0
    attention_seconds: float = 0.0
    steps: int = 0
    step_seconds: float = 0.0
    verified_trees: int = 0
    verified_nodes: int = 0
    accepted: int = 0
    kv_moves: int = 0
    own_steps: int = 0
    budget_choices: dict[int, int] = field(default_factory=dict)   # policy choice -> steps
    reach_caps: dict[str, float] = field(default_factory=dict)     # budget.reach_floor: class -> mean cap
    gain_decisions: dict[str, int] = field(default_factory=dict)   # budget.gain: kind -> requests
    step_kinds: dict[str, int] = field(default_factory=dict)       # BudgetControl.step_kind -> steps
    guard_ratio: float | None = None     # budget.gain.guard's last drafted / paused tokens-per-second ratio
    shadow_probes: int = 0       # budget.gain: shadow probes settled (budget/shadow.py) ...
    shadow_accepted: int = 0     # ... and the nodes they accepted
    plain_quiet_steps: int = 0   # quiet stretches' steps vLLM sampled as plain steps (engine/budget_control.py)
    metrics: Any = None          # TreeMetrics, or None when this worker exports nothing
    # plain lists: a step adds one count per tree, which numpy's per-call cost would dominate
    nodes_hist: list[int] = field(init=False)
    depth_hist: list[int] = field(init=False)

    def __post_init__(self) -> None:
        self.nodes_hist = [0] * (self.max_depth + 1)
        self.depth_hist = [0] * (self.max_depth + 1)

    def observe_draft(self, seconds: float, budgets: Sequence[int], trees: Sequence[Any]) -> None:
        """budgets: the node budget of each decoding request this step."""
        if self.metrics is not None:
            self.metrics.observe_draft(seconds, budgets)
        self.draft_steps += 1
        self.draft_seconds += seconds
        self.budget_sum += sum(budgets)
        self.budget_count += len(budgets)
        for t in trees:
            if t.num_draft:
                self.trees += 1
                self.nodes += t.num_draft

    def observe_verify(self, seconds: float, nodes: Sequence[int], accepted: Sequence[int],
                       moves: int, own: bool, parts: tuple[float, float, float] = (0.0, 0.0, 0.0)) -> None:
        """nodes / accepted: draft nodes and accepted path length of each verified tree; parts =
        (acceptance, KV compaction, tree attention) seconds of this step."""
        if self.metrics is not None:
            self.metrics.observe_verify(seconds, nodes, accepted, moves, parts)
        self.verify_steps += 1
        self.verify_seconds += seconds
        self.accept_seconds += parts[0]
        self.compaction_seconds += parts[1]
        self.attention_seconds += parts[2]
        self.verified_trees += len(nodes)
        self.verified_nodes += sum(nodes)
        self.accepted += sum(accepted)
        self.kv_moves += moves
        self.own_steps += int(own)
        top = self.max_depth
        for n in nodes:
            self.nodes_hist[min(n, top)] += 1
        for a in accepted:
            self.depth_hist[min(a, top)] += 1

    def observe_step(self, seconds: float) -> None:
        """One worker step (prepare inputs -> drafts for the next step)."""
        if self.metrics is not None:
            self.metrics.observe_step(seconds)
        self.steps += 1
        self.step_seconds += seconds

    def observe_steps(self, seconds: Sequence[float]) -> None:
        """`observe_step` for each of `seconds`, in one call (a quiet stretch's steps)."""
        if self.metrics is not None:
            self.metrics.observe_steps(seconds)
        self.steps += len(seconds)
        self.step_seconds += sum(seconds)

    def observe_budget_choice(self, nodes: int) -> None:
        """The budget policy's choice for a drafting step (before per-request caps)."""
        if self.metrics is not None:
            self.metrics.observe_budget_choice(nodes)
        self.budget_choices[nodes] = self.budget_choices.get(nodes, 0) + 1

    def observe_reach(self, caps: dict[str, float]) -> None:
        """budget.reach_floor: the mean node cap of the live requests of each sampling class."""
        if self.metrics is not None:
            self.metrics.observe_reach(caps)
        self.reach_caps = dict(caps)

    def observe_gain(self, counts: dict[str, int], costs: Sequence[float] | None,
                     coefficients: StepCoefficients | None) -> None:
        """budget.gain, once per step in which it decided: how many requests it let draft,
        probed, kept stopped, held for calibration or held because the step could not pay for
        its drafts (`held`); the costs it decided with (budget.gain.GainCosts: tokens per
        verified row, per drafting sampled request, per drafting greedy request, before the
        margin); its step-cost fit (budget.gain.StepCoefficients: base, per-request, per draft
        row and speculative-step seconds). Costs and fit are None in a step whose decisions did
        not need them (every request waiting for its probe): the gauges keep their last values."""
        if self.metrics is not None:
            self.metrics.observe_gain(counts, costs, coefficients)
        for kind, n in counts.items():
            self.gain_decisions[kind] = self.gain_decisions.get(kind, 0) + n

    def observe_step_kind(self, kind: str) -> None:
        """One drafting call's step: speculative, or plain and why (held, calibration, no
        drafts, prefill; engine/budget_control.py `step_kind`)."""
        self.step_kinds[kind] = self.step_kinds.get(kind, 0) + 1

    def observe_quiet_steps(self, steps: int, requests: int, calibration_steps: int, chosen: int,
                            gain_counts: dict[str, int], idle_kind: str = "no drafts") -> None:
        """`steps` steps of a quiet stretch of `requests` decoding requests (engine/budget_control.py),
        counted at its end as each step's `observe_budget_choice`, `observe_gain`,
        `observe_step_kind` and `observe_draft` would have counted it: nobody could draft, so
        each is a drafting step of 0 nodes, recorded at 0 seconds (the proposer skipped it);
        `idle_kind` is the kind of its steps that did not calibrate ("paused" under the guard's
        pause)."""
        if self.metrics is not None:
            self.metrics.observe_draft(0.0, (), steps)
            self.metrics.observe_budget_choice(chosen)
            self.metrics.observe_gain(gain_counts, None, None)
        self.draft_steps += steps
        self.budget_count += steps * requests
        self.budget_choices[chosen] = self.budget_choices.get(chosen, 0) + steps
        for kind, n in (("calibration", calibration_steps), (idle_kind, steps - calibration_steps)):
            if n:
                self.step_kinds[kind] = self.step_kinds.get(kind, 0) + n
        for kind, n in gain_counts.items():
            self.gain_decisions[kind] = self.gain_decisions.get(kind, 0) + n

    def observe_guard(self, ratio: float | None, drafting: bool) -> None:
        """budget.gain.guard, every step: its last test's drafted / paused tokens-per-second
        ratio (None before its first) and whether drafting is allowed now (budget/guard.py)."""
        if self.metrics is not None:
            self.metrics.observe_guard(ratio, drafting)
        self.guard_ratio = ratio

    def observe_shadow_probe(self, accepted: int) -> None:
        """budget.gain: a shadow probe settled by the tokens its request sampled, `accepted` of
        its nodes on the path (budget/shadow.py)."""
        self.shadow_probes += 1
        self.shadow_accepted += accepted

    def observe_fallback(self, reason: str) -> None:
        """A decoding request got no drafts this step; reason: the request option that forbids
        them (engine/eligibility.py). Counted on /metrics only: the proposer keeps per-request
        counts itself."""
        if self.metrics is not None:
            self.metrics.observe_fallback(reason)

    def flush_metrics(self) -> None:
        """Write the Prometheus series' buffered observations now (engine/metrics.py says why
        they are buffered): the proposer calls this when its last request finished."""
        if self.metrics is not None:
            self.metrics.flush()

    def summary(self) -> dict[str, Any]:
        return {
            "draft_steps": self.draft_steps, "draft_ms_per_step": 1e3 * self.draft_seconds / max(self.draft_steps, 1),
            "mean_budget": self.budget_sum / max(self.budget_count, 1),
            "verify_steps": self.verify_steps,
            "verify_ms_per_step": 1e3 * self.verify_seconds / max(self.verify_steps, 1),
            "accept_ms_per_step": 1e3 * self.accept_seconds / max(self.verify_steps, 1),
            "compaction_ms_per_step": 1e3 * self.compaction_seconds / max(self.verify_steps, 1),
            "attention_ms_per_step": 1e3 * self.attention_seconds / max(self.verify_steps, 1),
            "worker_step_ms": 1e3 * self.step_seconds / max(self.steps, 1),
            "drafted_trees": self.trees, "drafted_nodes": self.nodes,
            "verified_trees": self.verified_trees, "verified_nodes": self.verified_nodes,
            "accepted": self.accepted, "kv_moves": self.kv_moves, "own_steps": self.own_steps,
            "mean_accepted": self.accepted / max(self.verified_trees, 1),
            "nodes_hist": list(self.nodes_hist), "depth_hist": list(self.depth_hist),
            "budget_choices": dict(sorted(self.budget_choices.items())),
            "reach_caps": dict(self.reach_caps),
            "gain_decisions": dict(self.gain_decisions),
            "step_kinds": dict(self.step_kinds),
            "shadow_probes": self.shadow_probes, "shadow_accepted": self.shadow_accepted,
            "plain_quiet_steps": self.plain_quiet_steps,
        }
