"""The Triton kernels compile for sm_90 (H100) without a GPU, with no register spills.

Triton's interpreter (the other kernel tests) accepts code its compiler rejects, so every
shipped variant also goes through the real compiler and Triton's bundled ptxas, in a subprocess
without TRITON_INTERPRET and with a fresh cache (nothing stale can pass).
"""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="triton without its NVIDIA backend")
def test_kernels_compile_for_sm90(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    env.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    proc = subprocess.run([sys.executable, "-m", "vllm_treespec.kernels.compile_check",
                           "--arch", "90"], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("sm_90")]
    assert len(lines) >= 8, proc.stdout
    spilled = [ln for ln in lines if " stack     0 B" not in ln and "stack     ?" not in ln]
    assert not spilled, "register spills:\n" + "\n".join(spilled)
