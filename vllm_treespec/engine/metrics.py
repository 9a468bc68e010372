"""Prometheus series for trees, exported from the worker that drafts and verifies them.

vLLM's own `vllm:spec_decode_*` series already count trees right (drafted = nodes, accepted =
path length). These add what only the worker knows: nodes per tree, accepted depth, drafter and
verification time per step, the budget chosen, the reach caps, KV moves, and why requests decoded
without drafts. docs/metrics.md is the operator's reference for every series.

Writes are buffered in the worker and flushed at most every `FLUSH_SECONDS` and whenever the
worker's last request finishes (`TreeMetrics.flush`). Why: in multiprocess mode each histogram
sample or counter increment is a locked write into a shared file, microseconds each, and a step
with nothing drafted made about ten of them; measured served, those idle steps were the
worker's extra time over a server without speculation
(`bench_matrix_step_parts_sampled{,_buffered_metrics}_code-lm.json`). A
scrape therefore sees a busy worker's numbers up to `FLUSH_SECONDS` late, and everything once it
is idle.

Every series carries a `model_name` label with the served model name, the value vLLM puts on its
own `vllm:*` series, so one PromQL selector (or a join on `model_name`) covers both.

The worker is a separate process from the API server that serves `/metrics`; prometheus_client's
multiprocess mode joins them: `vllm-treespec serve` sets `PROMETHEUS_MULTIPROC_DIR` before vLLM
starts, vLLM's API server then reads every process's samples from that directory, and the
workers (which inherit the variable) write theirs there. Without the variable (e.g. plain
`vllm serve`, or the offline `LLM` API) nothing is exported and `make_metrics` logs a warning
naming the fix; the same numbers stay available in the proposer's `TreeStats`. Only
tensor-parallel rank 0 exports (and warns), so ranks are not double counted.
"""
from __future__ import annotations

import os
import time
from bisect import bisect_left
from typing import TYPE_CHECKING, Any, Sequence

if TYPE_CHECKING:
    from vllm_treespec.budget.gain import StepCoefficients

__all__ = ["TreeMetrics", "FLUSH_SECONDS", "MULTIPROC_ENV", "MODEL_LABEL", "UNEXPORTED_WARNING", "make_metrics",
           "model_label_value"]

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
MODEL_LABEL = "model_name"            # vLLM's label name for the served model on vllm:* series
UNKNOWN_MODEL = "unknown"             # label value when the config names no model (unit tests)
UNEXPORTED_WARNING = (
    "treespec_* metrics will not appear on /metrics: set PROMETHEUS_MULTIPROC_DIR to an empty "
    "directory before starting `vllm serve`, or start the server with `vllm-treespec serve`, "
    "which sets it (offline LLM runs have no /metrics and can ignore this)")
_COUNT_BUCKETS = (0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024)
_SECONDS_BUCKETS = (1e-5, 3e-5, 1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0)
FLUSH_SECONDS = 0.5     # longest a busy worker holds its observations back from /metrics


class _BufferedHistogram:
    """A histogram child's samples since the last flush, counted per bucket. The flush adds the
    counts to prometheus_client's per-bucket values in one write each (its `observe` writes the sum
    and one bucket per sample); where that client's internals differ, it replays the samples."""

    __slots__ = ("child", "bounds", "counts", "total", "values", "pending", "bulk")

    def __init__(self, child: Any) -> None:
        self.child = child
        self.bulk = all(hasattr(child, a) for a in ("_upper_bounds", "_buckets", "_sum"))
        self.bounds = list(child._upper_bounds) if self.bulk else []
        self.counts = [0] * len(self.bounds)
        self.total = 0.0
        self.values: list[float] = []       # the samples themselves, without bulk access
        self.pending = False

    def observe(self, value: float, count: int = 1) -> None:
        """`count` samples of `value`."""
        self.pending = True
        if not self.bulk:
            self.values.extend([value] * count)
            return
        self.counts[bisect_left(self.bounds, value)] += count    # the first bucket with value <= bound
        self.total += value * count

    def flush(self) -> None:
        if not self.pending:
            return
        self.pending = False
        if not self.bulk:
            for v in self.values:
                self.child.observe(v)
            self.values.clear()
            return
        self.child._sum.inc(self.total)
        for i, n in enumerate(self.counts):
            if n:
                self.child._buckets[i].inc(n)
                self.counts[i] = 0
        self.total = 0.0


def model_label_value(served_model_name: str | Sequence[str] | None) -> str:
    """The `model_name` label value, chosen as vLLM chooses it for its own series: the served
    model name, the first one when the server answers to several."""
    if isinstance(served_model_name, (list, tuple)):
        served_model_name = served_model_name[0] if served_model_name else None
    return str(served_model_name) if served_model_name else UNKNOWN_MODEL


class TreeMetrics:
    """The treespec_* series (created once per worker process), all labelled with the model."""

    def __init__(self, registry: Any = None, model_name: str = UNKNOWN_MODEL) -> None:
        """registry: prometheus_client's default one (None), or another for tests. model_name:
        the `model_name` label value (see `model_label_value`)."""
        import prometheus_client as prom

        reg = prom.REGISTRY if registry is None else registry
        self.model_name = model_name
        self._children: dict[tuple[int, str], Any] = {}    # see `_labelled`
        self._histograms: list[_BufferedHistogram] = []
        self._increments: dict[Any, float] = {}            # counter child -> increment since the flush
        self._values: dict[Any, float] = {}                # gauge child -> value set since the flush
        self._flushed_at = time.monotonic()
        self._gain_costs: Sequence[float] | None = None            # latest, until the flush
        self._gain_coefficients: StepCoefficients | None = None

        def histogram(name: str, doc: str, buckets: Sequence[float]) -> _BufferedHistogram:
            h = _BufferedHistogram(prom.Histogram(name, doc, [MODEL_LABEL], registry=reg,
                                                  buckets=buckets).labels(model_name))
            self._histograms.append(h)
            return h

        def gauge(name: str, doc: str, labels: Sequence[str] = ()) -> Any:
            # mostrecent: a gauge's value is the latest write of any worker process, not a sum
            g = prom.Gauge(name, doc, [MODEL_LABEL, *labels], registry=reg, multiprocess_mode="mostrecent")
            return g if labels else g.labels(model_name)

        def counter(name: str, doc: str, labels: Sequence[str] = ()) -> Any:
            c = prom.Counter(name, doc, [MODEL_LABEL, *labels], registry=reg)
            return c if labels else c.labels(model_name)

        self.nodes = histogram("treespec_tree_nodes", "Draft nodes verified per tree (after scheduler cuts).",
                               _COUNT_BUCKETS)
        self.depth = histogram("treespec_accepted_depth", "Accepted path length (draft tokens) per verified tree.",
                               _COUNT_BUCKETS)
        self.budget = histogram("treespec_budget_nodes", "Node budget chosen per decoding request and step.",
                                _COUNT_BUCKETS)
        self.budget_chosen = gauge("treespec_budget_chosen_nodes", "The budget policy's latest choice "
                                   "(node budget per request; 0 = plain decoding) for the step's load.")
        self._budget_chosen: int | None = None       # the value last set on it
        self.reach_cap = gauge("treespec_reach_cap_nodes", "budget.reach_floor: the mean node cap of the "
                               "live requests of each sampling class (greedy, sampled), learnt from "
                               "their acceptance.", ["sampling"])
        self.draft_seconds = histogram("treespec_draft_seconds", "Drafter + tree builder time per step.",
                                       _SECONDS_BUCKETS)
        self.verify_seconds = histogram("treespec_verify_seconds",
                                        "Tree acceptance + KV compaction time per step.", _SECONDS_BUCKETS)
        self.accept_seconds = histogram("treespec_accept_seconds", "Tree acceptance time per step.",
                                        _SECONDS_BUCKETS)
        self.compaction_seconds = histogram("treespec_compaction_seconds",
                                            "KV compaction time per step (all layers).", _SECONDS_BUCKETS)
        self.attention_seconds = histogram("treespec_tree_attention_seconds",
                                           "Tree-masked attention time per step (all layers, on top of "
                                           "the stock kernel).", _SECONDS_BUCKETS)
        self.step_seconds = histogram("treespec_worker_step_seconds",
                                      "Worker time per step: input preparation, forward, sampling "
                                      "and drafting.", _SECONDS_BUCKETS)
        self.kv_moves = counter("treespec_kv_moves", "KV slots moved to compact accepted paths.")
        self.fallbacks = counter("treespec_fallback_steps", "Decoding steps without drafts because a "
                                 "request option cannot be verified on a tree.", ["reason"])
        self.gain_decisions = counter("treespec_gain_decisions", "budget.gain: requests per decision "
                                      "(draft, probe, stopped, calibration, held, declined), one per request and step.",
                                      ["decision"])
        self.gain_cost = gauge("treespec_gain_cost_tokens", "budget.gain: measured cost in tokens of a "
                               "verified row (row) and of drafting at all (request: a sampled request's, greedy_request: "
                               "a greedy request's), before the margin.",
                               ["part"])
        self.gain_step = gauge("treespec_gain_step_seconds", "budget.gain's step-cost fit: base, per "
                               "decoding request (request), per verified draft row (row) and per speculative step "
                               "(speculative) seconds.",
                               ["part"])
        self.guard_ratio = gauge("treespec_guard_ratio", "budget.gain.guard's last test: tokens per second "
                                 "of drafted steps over paused steps at the load of the test.")
        self.guard_drafting = gauge("treespec_guard_drafting", "budget.gain.guard: 1 while drafting is "
                                    "allowed, 0 while paused (the guard's own test windows included).")
        self._guard: tuple[float | None, bool] | None = None      # the values last set on them


    def _labelled(self, metric: Any, value: str) -> Any:
        """`metric`'s child for (this model, `value`), looked up once: prometheus_client's
        `labels` takes a lock and builds its key on every call, and these series are written
        every step."""
        key = (id(metric), value)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(self.model_name, value)
        return child

    def _inc(self, child: Any, amount: float = 1.0) -> None:
        self._increments[child] = self._increments.get(child, 0.0) + amount

    def flush(self) -> None:
        """Write every observation held since the last flush to the Prometheus series."""
        self._flushed_at = time.monotonic()
        for h in self._histograms:
            h.flush()
        increments, self._increments = self._increments, {}
        for child, amount in increments.items():
            child.inc(amount)
        if self._gain_costs is not None:
            for part, value in zip(("row", "request", "greedy_request"), self._gain_costs):
                self._values[self._labelled(self.gain_cost, part)] = value
            self._gain_costs = None
        if self._gain_coefficients is not None:
            for part, value in self._gain_coefficients._asdict().items():
                self._values[self._labelled(self.gain_step, part)] = value
            self._gain_coefficients = None
        values, self._values = self._values, {}
        for child, value in values.items():
            child.set(value)

    def observe_draft(self, seconds: float, budgets: Sequence[int], steps: int = 1) -> None:
        """budgets: each decoding request's node budget, observed only in a step in which one
        may draft (a histogram sample costs microseconds in multiprocess mode, per request: at
        32 sampled clients nobody drafts in most steps, and that was 32 samples of 0 a step).
        `steps`: that many steps alike (a quiet stretch's, counted at its end)."""
        self.draft_seconds.observe(seconds, steps)
        if any(budgets):
            for b in budgets:
                self.budget.observe(b)

    def observe_budget_choice(self, nodes: int) -> None:
        if nodes != self._budget_chosen:     # set on change only: it is chosen every step
            self._budget_chosen = nodes
            self._values[self.budget_chosen] = nodes

    def observe_reach(self, caps: dict[str, float]) -> None:
        for sampling, nodes in caps.items():
            self._values[self._labelled(self.reach_cap, sampling)] = nodes

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
            self._inc(self.kv_moves, moves)

    def observe_step(self, seconds: float) -> None:
        """Once per worker step: also where a busy worker flushes."""
        self.step_seconds.observe(seconds)
        self._flush_if_due()

    def observe_steps(self, seconds: Sequence[float]) -> None:
        """`observe_step` for each of `seconds`."""
        observe = self.step_seconds.observe
        for s in seconds:
            observe(s)
        self._flush_if_due()

    def _flush_if_due(self) -> None:
        """Flush when the last flush lies FLUSH_SECONDS back (a busy worker's bound on staleness)."""
        if time.monotonic() - self._flushed_at >= FLUSH_SECONDS:
            self.flush()

    def observe_gain(self, counts: dict[str, int], costs: Sequence[float] | None,
                     coefficients: StepCoefficients | None) -> None:
        for decision, n in counts.items():
            if n:
                self._inc(self._labelled(self.gain_decisions, decision), n)
        if costs is not None:                # labelled at the flush: decided every step
            self._gain_costs = costs
        if coefficients is not None:
            self._gain_coefficients = coefficients

    def observe_guard(self, ratio: float | None, drafting: bool) -> None:
        """Every step: set on change only."""
        if (ratio, drafting) != self._guard:
            self._guard = (ratio, drafting)
            if ratio is not None:
                self._values[self.guard_ratio] = ratio
            self._values[self.guard_drafting] = 1.0 if drafting else 0.0

    def observe_fallback(self, reason: str) -> None:
        self._inc(self._labelled(self.fallbacks, reason))


def _is_output_rank() -> bool:
    try:
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank

        return get_tensor_model_parallel_rank() == 0
    except Exception:  # no distributed state (unit tests): a single process is its own rank 0
        return True


def make_metrics(served_model_name: str | Sequence[str] | None = None) -> TreeMetrics | None:
    """TreeMetrics labelled with the served model when this worker's samples can reach /metrics,
    else None (after warning once per worker, on the exporting rank, that they will not)."""
    if not _is_output_rank():
        return None
    if not os.environ.get(MULTIPROC_ENV):
        _warn_unexported()
        return None
    return TreeMetrics(model_name=model_label_value(served_model_name))


def _worker_in_own_process() -> bool:
    """True when this worker runs in a child process (vLLM's engine core, or a worker of its
    multiprocess executor), as it always does behind `vllm serve`: samples then reach the API
    server's /metrics only through prometheus_client's multiprocess directory."""
    import multiprocessing

    return multiprocessing.parent_process() is not None


def _warn_unexported() -> None:
    """Say why the treespec_* series are missing and how to get them, instead of letting them
    vanish silently. A worker in the main process (the offline `LLM` API with
    VLLM_ENABLE_V1_MULTIPROCESSING=0, unit tests) is never behind a server: INFO there."""
    from vllm.logger import init_logger   # here: importing this module must not load vLLM

    logger = init_logger(f"vllm.{__name__}")
    if _worker_in_own_process():
        logger.warning(UNEXPORTED_WARNING)
    else:
        logger.info(UNEXPORTED_WARNING)
