"""The device script's CPU part (CI cannot lend a GPU): `gpu_check.sh --dry-run` runs the
forward-cost timer, the engine-free loop and the kernel benchmark on tiny shapes in Triton's
interpreter and must write their records."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_gpu_check_dry_run_writes_every_record(tmp_path):
    env = dict(os.environ, PYTHON=sys.executable, TRITON_INTERPRET="1")
    proc = subprocess.run(["bash", str(REPO / "benchmarks" / "gpu_check.sh"), "--dry-run",
                           str(tmp_path)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    loop = json.loads((tmp_path / "gpu_loop.json").read_text())
    assert loop["exit_code"] == 0 and loop["vllm_modules"] == []
    assert all(run["equal"] for runs in loop["runs"].values() for name, run in runs.items()
               if name.startswith("tree"))
    costs = json.loads((tmp_path / "gpu_forward_costs.json").read_text())
    assert costs["target"], "no target forward was timed"
    kernels = json.loads((tmp_path / "bench_kernels.json").read_text())
    assert isinstance(kernels["attention"][0]["tree_triton_ms"], float)
    assert kernels["attention"][0]["max_abs_diff_req0_vs_fp64"] < 1e-2


def test_gpu_check_skips_named_steps_and_keeps_a_deadline():
    text = (REPO / "benchmarks" / "gpu_check.sh").read_text()
    assert "GPU_CHECK_SKIP" in text and "GPU_CHECK_BUDGET_S" in text
    assert subprocess.run(["bash", "-n", str(REPO / "benchmarks" / "gpu_check.sh")]).returncode == 0
