"""The treespec_* Prometheus series (engine/metrics.py): every one carries vLLM's `model_name`
label and is documented in docs/metrics.md; a worker that cannot export them says how to fix it;
benchmark records name the hardware they ran on (benchmarks/harness/report.py)."""
from __future__ import annotations

import logging
import multiprocessing
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry

from vllm_treespec.budget.gain import StepCoefficients
from vllm_treespec.engine import metrics as metrics_mod
from vllm_treespec.engine.metrics import (MODEL_LABEL, MULTIPROC_ENV, UNEXPORTED_WARNING, TreeMetrics,
                                          make_metrics, model_label_value)
from vllm_treespec.engine.tree_stats import TreeStats

DOCS = Path(__file__).resolve().parent.parent / "docs" / "metrics.md"


def _fed_registry(model: str = "code-lm") -> CollectorRegistry:
    """A private registry with every series observed once through TreeStats, as the proposer feeds it."""
    registry = CollectorRegistry()
    stats = TreeStats(8, metrics=TreeMetrics(registry, model_name=model))
    stats.observe_budget_choice(6)
    stats.observe_draft(0.002, [6, 4], [SimpleNamespace(num_draft=6), SimpleNamespace(num_draft=0)])
    stats.observe_verify(0.003, [6], [2], moves=2, own=True, parts=(0.001, 0.0005, 0.0004))
    stats.observe_step(0.02)
    stats.observe_reach({"greedy": 8.0, "sampled": 3.5})
    stats.observe_fallback("logprobs")
    stats.observe_gain({"draft": 1, "probe": 0, "stopped": 3, "calibration": 0}, (0.05, 0.6),
                       StepCoefficients(base=0.003, request=4e-4, row=1e-4, speculative=8e-4))
    stats.observe_guard(0.87, False)
    stats.flush_metrics()
    return registry


def _treespec_families(registry: CollectorRegistry) -> dict[str, object]:
    return {f.name: f for f in registry.collect() if f.name.startswith("treespec_")}


def test_every_series_carries_the_model_name_label():
    families = _treespec_families(_fed_registry("code-lm"))
    assert len(families) == 18
    for name, family in families.items():
        samples = [s for s in family.samples if not s.name.endswith("_created")]
        assert samples, f"{name} has no samples"
        for s in samples:
            assert s.labels.get(MODEL_LABEL) == "code-lm", (s.name, s.labels)


def test_labelled_series_keep_their_own_labels():
    registry = _fed_registry("m")
    assert registry.get_sample_value("treespec_reach_cap_nodes",
                                     {MODEL_LABEL: "m", "sampling": "sampled"}) == 3.5
    assert registry.get_sample_value("treespec_fallback_steps_total",
                                     {MODEL_LABEL: "m", "reason": "logprobs"}) == 1.0
    assert registry.get_sample_value("treespec_accepted_depth_sum", {MODEL_LABEL: "m"}) == 2.0
    assert registry.get_sample_value("treespec_kv_moves_total", {MODEL_LABEL: "m"}) == 2.0
    assert registry.get_sample_value("treespec_gain_decisions_total",
                                     {MODEL_LABEL: "m", "decision": "stopped"}) == 3.0
    assert registry.get_sample_value("treespec_gain_cost_tokens", {MODEL_LABEL: "m", "part": "request"}) == 0.6
    assert registry.get_sample_value("treespec_gain_step_seconds",
                                     {MODEL_LABEL: "m", "part": "speculative"}) == 8e-4
    assert registry.get_sample_value("treespec_gain_step_seconds", {MODEL_LABEL: "m", "part": "request"}) == 4e-4


def test_every_series_is_documented():
    """docs/metrics.md names each exposed series (counters with their _total suffix)."""
    text = DOCS.read_text()
    for name, family in _treespec_families(_fed_registry()).items():
        exposed = name + "_total" if family.type == "counter" else name
        assert re.search(rf"`{exposed}`", text), f"{exposed} is not in docs/metrics.md"


@pytest.mark.parametrize("served, label", [("my-model", "my-model"), (["first", "alias"], "first"),
                                            (None, "unknown"), ([], "unknown")])
def test_model_label_is_vllms_served_name(served, label):
    assert model_label_value(served) == label


# -- the warning when the series cannot reach /metrics ----------------------------------------

class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@pytest.fixture()
def metrics_log():
    """Records of the metrics module's logger, caught on the logger itself: vLLM's loggers do
    not propagate to the root logger that caplog watches."""
    logger = logging.getLogger(f"vllm.{metrics_mod.__name__}")
    handler, level = _Records(), logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.DEBUG)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def _records(log: _Records, level: int) -> list[str]:
    return [r.getMessage() for r in log.records if r.levelno == level]


def test_worker_process_without_multiproc_dir_warns_with_the_fix(monkeypatch, metrics_log):
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    monkeypatch.setattr(metrics_mod, "_worker_in_own_process", lambda: True)
    assert make_metrics("m") is None
    assert _records(metrics_log, logging.WARNING) == [UNEXPORTED_WARNING]
    assert "PROMETHEUS_MULTIPROC_DIR" in UNEXPORTED_WARNING and "vllm-treespec serve" in UNEXPORTED_WARNING


def test_in_process_engine_gets_the_note_at_info_only(monkeypatch, metrics_log):
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    monkeypatch.setattr(metrics_mod, "_worker_in_own_process", lambda: False)
    assert make_metrics("m") is None
    assert _records(metrics_log, logging.WARNING) == []
    assert _records(metrics_log, logging.INFO) == [UNEXPORTED_WARNING]


def test_multiproc_dir_set_exports_without_warning(monkeypatch, metrics_log, tmp_path):
    import prometheus_client

    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    monkeypatch.setattr(metrics_mod, "_worker_in_own_process", lambda: True)
    monkeypatch.setattr(prometheus_client, "REGISTRY", CollectorRegistry())   # the default one, fresh
    m = make_metrics(["served", "alias"])
    assert isinstance(m, TreeMetrics) and m.model_name == "served"
    assert _records(metrics_log, logging.WARNING) == [] and _records(metrics_log, logging.INFO) == []


def test_non_output_rank_neither_exports_nor_warns(monkeypatch, metrics_log):
    monkeypatch.delenv(MULTIPROC_ENV, raising=False)
    monkeypatch.setattr(metrics_mod, "_is_output_rank", lambda: False)
    monkeypatch.setattr(metrics_mod, "_worker_in_own_process", lambda: True)
    assert make_metrics("m") is None
    assert metrics_log.records == []


def _report_own_process(queue) -> None:
    queue.put(metrics_mod._worker_in_own_process())


def test_worker_in_own_process_tells_a_child_from_the_main_process():
    assert metrics_mod._worker_in_own_process() is False    # pytest: the main process
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_report_own_process, args=(queue,))
    child.start()
    child.join(60)
    assert queue.get(timeout=5) is True


def test_proposer_labels_its_series_with_the_served_model(monkeypatch, tmp_path):
    import prometheus_client

    from test_proposer import _vllm_config
    from vllm_treespec.engine.proposer import TreeProposer

    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    registry = CollectorRegistry()
    monkeypatch.setattr(prometheus_client, "REGISTRY", registry)
    cfg = _vllm_config(k=4)
    cfg.model_config.served_model_name = "served-lm"
    assert TreeProposer(cfg).stats.metrics.model_name == "served-lm"
    assert registry.get_sample_value("treespec_tree_nodes_count", {MODEL_LABEL: "served-lm"}) == 0.0
    monkeypatch.setattr(prometheus_client, "REGISTRY", CollectorRegistry())
    assert TreeProposer(_vllm_config(k=4)).stats.metrics.model_name == "unknown"   # no name in config


# -- benchmark records: where they were measured ------------------------------------------------

def test_hardware_info_on_this_cpu_host_says_cpu_only_and_names_the_cpu():
    import torch

    from harness.report import cpu_model, hardware_info, hardware_line

    if torch.cuda.is_available():
        pytest.skip("a GPU host")
    hw = hardware_info()
    assert hw["gpu_count"] == 0 and hw["gpus"] == [] and hw["accelerator"] == "CPU only"
    assert hw["cpu_model"] == cpu_model() and hw["cpu_model"]
    assert hw["cpu_cores"] >= 1 and hw["usable_cores"] >= 1 and hw["mem_gib"] > 0
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and "model name" in cpuinfo.read_text():
        assert hw["cpu_model"] in cpuinfo.read_text()
    assert hardware_line(hw).endswith("; CPU only")


def test_gpu_summary_counts_identical_devices():
    from harness.report import _gpu_summary

    h100 = {"name": "NVIDIA H100 80GB HBM3", "mem_gib": 79.2}
    s = _gpu_summary([h100, h100])
    assert s["gpu_count"] == 2 and s["accelerator"] == "2x NVIDIA H100 80GB HBM3 (79.2 GiB)"


def test_gpu_probe_runs_in_a_child_process(monkeypatch):
    """A CUDA build of torch is asked in a child (real probe here: a CPU host reports none)."""
    import torch

    from harness import report

    if torch.cuda.is_available():
        pytest.skip("a GPU host")
    monkeypatch.setattr(torch.version, "cuda", "12.8")      # as a CUDA wheel on a host without GPUs
    assert report.gpu_info() == {"gpu_count": 0, "gpus": [], "accelerator": "CPU only"}
    assert not torch.cuda.is_initialized()


def test_gpu_probe_output_and_failure(monkeypatch):
    import subprocess

    import torch

    from harness import report

    monkeypatch.setattr(torch.version, "cuda", "12.8")
    probed = '[{"name": "NVIDIA H200", "mem_gib": 139.8}]'
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: SimpleNamespace(stdout=probed + "\n"))
    assert report.gpu_info() == {"gpu_count": 1, "gpus": [{"name": "NVIDIA H200", "mem_gib": 139.8}],
                                 "accelerator": "1x NVIDIA H200 (139.8 GiB)"}

    def fail(*a, **k):
        raise subprocess.CalledProcessError(1, "python")
    monkeypatch.setattr(subprocess, "run", fail)
    info = report.gpu_info()
    assert info["gpu_count"] is None and info["accelerator"].startswith("GPU unknown")


def test_hardware_line_of_an_old_record_does_not_guess_the_gpu():
    from harness.report import hardware_line

    old = {"cpu_model": "Xeon", "usable_cores": 2, "cpu_cores": 2, "mem_gib": 16.0}
    assert hardware_line(old).endswith("; GPU not recorded")


def test_a_step_decided_without_costs_keeps_the_cost_gauges():
    """budget.gain skips its costs in steps whose requests all wait for a probe: the decisions
    are counted, the cost and fit gauges keep the values last decided with."""
    registry = CollectorRegistry()
    stats = TreeStats(8, metrics=TreeMetrics(registry, model_name="m"))
    stats.observe_gain({"draft": 1}, (0.05, 0.6, 0.1), StepCoefficients(0.003, 4e-4, 1e-4, 8e-4))
    stats.observe_gain({"stopped": 2}, None, None)
    stats.flush_metrics()
    assert registry.get_sample_value("treespec_gain_cost_tokens", {MODEL_LABEL: "m", "part": "row"}) == 0.05
    assert registry.get_sample_value("treespec_gain_step_seconds", {MODEL_LABEL: "m", "part": "row"}) == 1e-4
    assert registry.get_sample_value("treespec_gain_decisions_total", {MODEL_LABEL: "m", "decision": "stopped"}) == 2
    assert stats.gain_decisions == {"draft": 1, "stopped": 2}


def test_budgets_are_sampled_only_in_steps_in_which_a_request_may_draft():
    """treespec_budget_nodes: one sample per decoding request in a step in which any may draft;
    a step in which none may adds none (at 32 sampled clients, most steps), its draft time still
    counted."""
    registry = CollectorRegistry()
    stats = TreeStats(8, metrics=TreeMetrics(registry, model_name="m"))
    stats.observe_draft(0.001, [0, 0, 0], [])
    stats.flush_metrics()
    assert registry.get_sample_value("treespec_budget_nodes_count", {MODEL_LABEL: "m"}) == 0.0
    assert registry.get_sample_value("treespec_draft_seconds_count", {MODEL_LABEL: "m"}) == 1.0
    stats.observe_draft(0.001, [0, 4, 0], [])
    stats.flush_metrics()
    assert registry.get_sample_value("treespec_budget_nodes_count", {MODEL_LABEL: "m"}) == 3.0
    assert registry.get_sample_value("treespec_budget_nodes_sum", {MODEL_LABEL: "m"}) == 4.0


# -- buffered writes ---------------------------------------------------------------------------

def _histogram_samples(registry: CollectorRegistry, name: str) -> dict[tuple, float]:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in registry.collect() if f.name == name for s in f.samples if not s.name.endswith("_created")}


def test_buffered_histogram_flushes_what_direct_observes_write():
    """Bucket counts and sum after a flush equal prometheus_client's own observe, edge values
    (on a bound, above the last finite bound) included."""
    import prometheus_client as prom

    values = [0, 1, 2, 2, 5, 6, 16, 17, 1024, 5000, 0.5]
    direct = CollectorRegistry()
    h = prom.Histogram("treespec_tree_nodes", "x", [MODEL_LABEL], registry=direct,
                       buckets=(0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024)).labels("m")
    for v in values:
        h.observe(v)
    buffered = CollectorRegistry()
    metrics = TreeMetrics(buffered, model_name="m")
    for v in values:
        metrics.nodes.observe(v)
    assert buffered.get_sample_value("treespec_tree_nodes_count", {MODEL_LABEL: "m"}) == 0.0   # held back
    metrics.flush()
    assert _histogram_samples(buffered, "treespec_tree_nodes") == _histogram_samples(direct, "treespec_tree_nodes")
    metrics.flush()                                  # nothing new: nothing added twice
    assert buffered.get_sample_value("treespec_tree_nodes_count", {MODEL_LABEL: "m"}) == len(values)


def test_a_quiet_stretch_is_counted_as_its_steps_one_by_one():
    """TreeStats.observe_quiet_steps (the steps a quiet stretch skipped, counted at its end)
    writes the series and counters that each step's own observations would have written."""
    one_by_one, bulk = CollectorRegistry(), CollectorRegistry()
    a = TreeStats(8, metrics=TreeMetrics(one_by_one, model_name="m"))
    b = TreeStats(8, metrics=TreeMetrics(bulk, model_name="m"))
    for step in range(5):
        calibrating = step == 3
        a.observe_budget_choice(8)
        a.observe_gain({"calibration": 2} if calibrating else {"stopped": 1, "held": 1}, None, None)
        a.observe_step_kind("calibration" if calibrating else "no drafts")
        a.observe_draft(0.0, [0, 0], ())
    b.observe_quiet_steps(5, 2, 1, 8, {"stopped": 4, "held": 4, "calibration": 2})
    a.flush_metrics()
    b.flush_metrics()
    for name in ("treespec_draft_seconds", "treespec_gain_decisions", "treespec_budget_nodes"):
        assert _histogram_samples(bulk, name) == _histogram_samples(one_by_one, name) != {}
    fields = ("draft_steps", "budget_count", "budget_sum", "budget_choices", "step_kinds", "gain_decisions")
    assert [getattr(b, f) for f in fields] == [getattr(a, f) for f in fields]


def test_histogram_without_bulk_access_replays_its_samples():
    class Child:
        def __init__(self):
            self.seen = []

        def observe(self, v):
            self.seen.append(v)

    from vllm_treespec.engine.metrics import _BufferedHistogram

    child = Child()
    h = _BufferedHistogram(child)
    h.observe(3.0)
    h.observe(1.0)
    assert not h.bulk and child.seen == []
    h.flush()
    h.flush()
    assert child.seen == [3.0, 1.0]


def test_a_busy_worker_flushes_on_a_step_after_flush_seconds(monkeypatch):
    import vllm_treespec.engine.metrics as metrics_module

    clock = [100.0]
    monkeypatch.setattr(metrics_module.time, "monotonic", lambda: clock[0])
    registry = CollectorRegistry()
    stats = TreeStats(8, metrics=TreeMetrics(registry, model_name="m"))
    stats.observe_fallback("logprobs")
    stats.observe_step(0.002)
    assert not registry.get_sample_value("treespec_fallback_steps_total", {MODEL_LABEL: "m", "reason": "logprobs"})
    clock[0] += metrics_module.FLUSH_SECONDS
    stats.observe_step(0.002)
    assert registry.get_sample_value("treespec_fallback_steps_total", {MODEL_LABEL: "m", "reason": "logprobs"}) == 1.0
    assert registry.get_sample_value("treespec_worker_step_seconds_count", {MODEL_LABEL: "m"}) == 2.0


def test_proposer_flushes_when_its_last_request_finishes(monkeypatch, tmp_path):
    import prometheus_client

    from test_proposer import _vllm_config
    from vllm_treespec.engine.proposer import TreeProposer

    monkeypatch.setenv(MULTIPROC_ENV, str(tmp_path))
    registry = CollectorRegistry()
    monkeypatch.setattr(prometheus_client, "REGISTRY", registry)
    proposer = TreeProposer(_vllm_config(k=4))
    proposer.stats.observe_step(0.001)
    assert registry.get_sample_value("treespec_worker_step_seconds_count", {MODEL_LABEL: "unknown"}) == 0.0
    proposer.on_requests_finished([])                # no request left: idle
    assert registry.get_sample_value("treespec_worker_step_seconds_count", {MODEL_LABEL: "unknown"}) == 1.0
