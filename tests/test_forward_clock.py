"""The served forward clock: the server-side patch sums forward seconds into a file the benchmark
reads; the drift-corrected ratio cancels a turn's machine speed."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from harness.forward_clock import SLOTS, clock_env, drift_corrected, new_clock, read_clock, read_slots, slot_deltas
from bench_matrix import paired_corrected_ratio, parts_summary, parts_table, summed_corrected_ratio


def test_new_clock_reads_zero(tmp_path):
    clock = new_clock(tmp_path / "c.bin")
    assert read_clock(clock) == (0.0, 0)
    assert read_slots(clock) == {k: (0.0, 0) for k in SLOTS}


def test_drift_corrected_cancels_a_slower_turn():
    # Both sides do the same work outside the forward per unit of forward; B's turn ran on a
    # machine 30% slower, so its raw ratio reads 0.77 and the corrected one 1.0.
    assert drift_corrected(100, 1.3, 0.65, 100, 1.0, 0.5) == pytest.approx(1.0)
    # B spends 10% more time per unit of forward.
    assert drift_corrected(100, 1.1, 0.5, 100, 1.0, 0.5) == pytest.approx(1 / 1.1)
    assert drift_corrected(100, 1.0, 0.0, 100, 1.0, 0.5) is None     # no forward read


def test_corrected_ratios_of_a_cell():
    turns = [(10, 2.0, 1.0, 10, 1.0, 0.5), (10, 1.0, 0.5, 10, 1.1, 0.5), (10, 1.0, 0.5, 10, 1.0, 0.5)]
    assert paired_corrected_ratio(turns) == pytest.approx(1.0)
    assert summed_corrected_ratio(turns) == pytest.approx((30 / (4.0 / 2.0)) / (30 / (3.1 / 1.5)))
    assert paired_corrected_ratio([]) is None and summed_corrected_ratio([]) is None


def test_server_side_patch_sums_every_forward(tmp_path):
    """In a fresh interpreter started as a served process is (the site directory on PYTHONPATH),
    importing vLLM's model runner wraps its forward, and each call adds to the file."""
    clock = new_clock(tmp_path / "c.bin")
    script = textwrap.dedent("""
        import time
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner

        class Runner:
            def model(self, **kwargs):
                time.sleep(0.02)
                return kwargs["input_ids"]

        for i in range(3):
            assert GPUModelRunner._model_forward(Runner(), input_ids=i) == i
    """)
    env = {**os.environ, **clock_env(clock)}
    subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, check=True, timeout=300)
    seconds, calls = read_clock(clock)
    assert calls == 3
    assert 0.06 <= seconds < 3.0


def test_patch_is_inert_without_the_variable(tmp_path):
    clock = new_clock(tmp_path / "c.bin")
    env = {**os.environ, **clock_env(clock)}
    del env["TREESPEC_FORWARD_CLOCK"]
    script = ("from vllm.v1.worker.gpu_model_runner import GPUModelRunner\n"
              "assert GPUModelRunner._model_forward.__name__ == '_model_forward'\n")
    subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, check=True, timeout=300)
    assert read_clock(clock) == (0.0, 0)


def test_server_side_patch_times_each_step_part(tmp_path):
    """The worker's execute call, the scheduler's two calls and the API server's output processing
    land in their own slots; a part's time includes what it calls (the plugin patches callees)."""
    clock = new_clock(tmp_path / "c.bin")
    script = textwrap.dedent("""
        import time
        from vllm.v1.worker.gpu_worker import Worker
        from vllm.v1.core.sched.scheduler import Scheduler

        class SlowWorker:                       # the first thing execute_model reads takes 30 ms
            @property
            def _pp_send_work(self):
                time.sleep(0.03)
                raise RuntimeError("stop here")

        for call in (lambda: Worker.execute_model(SlowWorker(), None), lambda: Scheduler.schedule(object())):
            try:
                call()
            except Exception:
                pass
    """)
    env = {**os.environ, **clock_env(clock)}
    subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, check=True, timeout=300)
    slots = read_slots(clock)
    assert slots["schedule"][1] == 1 and slots["worker_execute"][1] == 1   # timed even when it raises
    assert 0.03 <= slots["worker_execute"][0] < 3.0
    assert slots["forward"] == (0.0, 0) and slots["frontend_outputs"] == (0.0, 0)
    before = {k: (0.0, 0) for k in SLOTS}
    assert slot_deltas(slots, before) == slots


def test_parts_summary_normalises_by_forward():
    rounds = [{"turn_seconds": [2.0], "turn_tokens": [100],
               "turn_parts": [{"forward": [1.0, 50], "engine_step": [1.5, 50], "schedule": [0.1, 50]}]},
              {"turn_seconds": [4.0], "turn_tokens": [100],
               "turn_parts": [{"forward": [2.0, 50], "engine_step": [3.0, 50], "schedule": [0.2, 50]}]}]
    p = parts_summary(rounds)
    assert p["per_forward"] == {"forward": 1.0, "engine_step": 1.5, "schedule": 0.1, "wall": 2.0}
    assert p["ms_per_token"]["schedule"] == pytest.approx(1.5)
    assert p["engine_steps_per_token"] == 0.5
    assert parts_summary([{"turn_seconds": [1.0], "turn_tokens": [10]}]) is None   # an old record
    table = parts_table([{"regime": "T=0.7 c=1", "configs": {"off": {"parts": p}}}], ["off"])
    assert "| T=0.7 c=1 | off | " in table and "1.500" in table


def test_server_side_slots_are_the_readers_slots(monkeypatch):
    """The server-side table and the reader's SLOTS name the same slots: 0 .. len(SLOTS) - 1, each
    at least once (the file layout both sides assume; a slot may sum methods that never nest, as
    the proposer's drafting call and its quiet step)."""
    import importlib.util

    from harness.forward_clock import ENV_VAR, SITE_DIR

    monkeypatch.delenv(ENV_VAR, raising=False)          # loaded inert: nothing is patched
    spec = importlib.util.spec_from_file_location("forward_clock_sitecustomize", SITE_DIR / "sitecustomize.py")
    site = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(site)
    slots = sorted(slot for targets in site._TARGETS.values() for *_, slot in targets)
    assert sorted(set(slots)) == list(range(len(SLOTS))) and site._NUM_SLOTS == len(SLOTS)
    assert len(slots) == len(SLOTS) + 1      # only the proposer's slot sums two methods
