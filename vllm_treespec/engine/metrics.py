"""Prometheus series for trees, exported from the worker that drafts and verifies them.

vLLM's own `vllm:spec_decode_*` series already count trees right (drafted = nodes, accepted =
path length). These add what only the worker knows: nodes per tree, accepted depth, drafter and
verification time per step, the budget chosen, the reach caps, KV moves, and why requests decoded
without drafts.

The worker is a separate process from the API server that serves `/metrics`; prometheus_client's
multiprocess mode joins them: `vllm-treespec serve` sets `PROMETHEUS_MULTIPROC_DIR` before vLLM
starts, vLLM's API server then reads every process's samples from that directory, and the
workers (which inherit the variable) write theirs there. Without the variable (e.g. plain
`vllm serve`, or the offline `LLM` API) nothing is exported; the same numbers stay available in
the proposer's `TreeStats`. Only tensor-parallel rank 0 exports, so ranks are not double counted.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

__all__ = ["TreeMetrics", "MULTIPROC_ENV", "make_metrics"]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_COUNT_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024)
_SECONDS_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)


class TreeMetrics:
    """The treespec_* series (created once per worker process)."""

    def __init__(self, registry: Any = None) -> None:
        """registry: prometheus_client's default one (None), or another for tests."""
        from functools import partial

        import prometheus_client as prom

        reg = prom.REGISTRY if registry is None else registry
        Counter = partial(prom.Counter, registry=reg)
        Gauge = partial(prom.Gauge, registry=reg)
        Histogram = partial(prom.Histogram, registry=reg)

        self.nodes = Histogram("treespec_tree_nodes", "Draft nodes verified per tree (after scheduler cuts).",
                               buckets=_COUNT_BUCKETS)
        self.depth = Histogram("treespec_accepted_depth", "Accepted path length (draft tokens) per verified tree.",
                               buckets=_COUNT_BUCKETS)
        self.budget = Histogram("treespec_budget_nodes", "Node budget chosen per decoding request and step.",
                                buckets=_COUNT_BUCKETS)
        self.budget_chosen = Gauge("treespec_budget_chosen_nodes", "The budget policy's latest choice "
                                   "(node budget per request; 0 = plain decoding) for the step's load.",
                                   multiprocess_mode="mostrecent")
        self.reach_cap = Gauge("treespec_reach_cap_nodes", "budget.reach_floor: the mean node cap of the "
                               "live requests of each sampling class (greedy, sampled), learnt from "
                               "their acceptance.", ["sampling"], multiprocess_mode="mostrecent")
        self.draft_seconds = Histogram("treespec_draft_seconds", "Drafter + tree builder time per step.",
                                       buckets=_SECONDS_BUCKETS)
        self.verify_seconds = Histogram("treespec_verify_seconds",
                                        "Tree acceptance + KV compaction time per step.",
                                        buckets=_SECONDS_BUCKETS)
        self.accept_seconds = Histogram("treespec_accept_seconds", "Tree acceptance time per step.",
                                        buckets=_SECONDS_BUCKETS)
        self.compaction_seconds = Histogram("treespec_compaction_seconds",
                                            "KV compaction time per step (all layers).",
                                            buckets=_SECONDS_BUCKETS)
        self.attention_seconds = Histogram("treespec_tree_attention_seconds",
                                           "Tree-masked attention time per step (all layers, on top of "
                                           "the stock kernel).", buckets=_SECONDS_BUCKETS)
        self.step_seconds = Histogram("treespec_worker_step_seconds",
                                      "Worker time per step: input preparation, forward, sampling "
                                      "and drafting.", buckets=_SECONDS_BUCKETS)
        self.kv_moves = Counter("treespec_kv_moves", "KV slots moved to compact accepted paths.")
        self.fallbacks = Counter("treespec_fallback_steps", "Decoding steps without drafts because a "
                                 "request option cannot be verified on a tree.", ["reason"])

    def observe_draft(self, seconds: float, budgets: Sequence[int]) -> None:
        self.draft_seconds.observe(seconds)
        for b in budgets:
            self.budget.observe(b)

    def observe_budget_choice(self, nodes: int) -> None:
        self.budget_chosen.set(nodes)

    def observe_reach(self, caps: dict[str, float]) -> None:
        for sampling, nodes in caps.items():
            self.reach_cap.labels(sampling=sampling).set(nodes)

    def observe_verify(self, seconds: float, nodes: Sequence[int], accepted: Sequence[int], moves: int,
                       parts: tuple[float, float, float]) -> None:
        self.verify_seconds.observe(seconds)
        self.accept_seconds.observe(parts[0])
        self.compaction_seconds.observe(parts[1])
        self.attention_seconds.observe(parts[2])
        for n, a in zip(nodes, accepted):
            self.nodes.observe(n)
            self.depth.observe(a)
        if moves:
            self.kv_moves.inc(moves)

    def observe_step(self, seconds: float) -> None:
        self.step_seconds.observe(seconds)

    def observe_fallback(self, reason: str) -> None:
        self.fallbacks.labels(reason=reason).inc()


def _is_output_rank() -> bool:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank() == 0
    except Exception:  # no distributed state (unit tests): a single process is its own rank 0
        return True


def make_metrics() -> Any:
    """TreeMetrics when this worker's samples can reach /metrics, else None."""
    if not os.environ.get(MULTIPROC_ENV) or not _is_output_rank():
        return None
    return TreeMetrics()
