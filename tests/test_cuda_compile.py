"""The CUDA sources in csrc/cuda/ compile (CI check without a GPU; skipped without nvcc).

Each .cu file is compiled on its own with plain nvcc (they include only launchers.h and the CUDA
runtime). bindings.cpp needs torch's headers: it is syntax-checked with the host compiler
against the installed torch; a CPU torch wheel lacks the one CMake-generated CUDA header
(c10/cuda/impl/cuda_cmake_macros.h), which is stubbed in a temp dir for the check.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

import pytest

CSRC = Path(__file__).resolve().parents[1] / "csrc" / "cuda"
CU_FILES = sorted(CSRC.glob("*.cu"))


def _nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    home = os.environ.get("CUDA_HOME") or "/usr/local/cuda"
    path = Path(home) / "bin" / "nvcc"
    return str(path) if path.exists() else None


NVCC = _nvcc()
pytestmark = pytest.mark.skipif(NVCC is None, reason="nvcc not found (CUDA compile check "
                                                      "needs the CUDA toolkit)")


def test_sources_present():
    assert {p.name for p in CU_FILES} >= {"tree_accept.cu", "kv_compaction.cu"}
    assert (CSRC / "bindings.cpp").exists() and (CSRC / "launchers.h").exists()


@pytest.mark.parametrize("source", CU_FILES, ids=lambda p: p.name)
def test_cu_compiles_with_nvcc(source, tmp_path):
    cmd = [NVCC, "-std=c++17", "-O3", "-arch=sm_90", "-Werror", "all-warnings", "-c",
           str(source), "-o", str(tmp_path / (source.stem + ".o"))]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


def test_bindings_syntax_against_torch_headers(tmp_path):
    torch = pytest.importorskip("torch")
    cxx = shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    include = Path(torch.__file__).parent / "include"
    if not (include / "c10" / "cuda" / "CUDAStream.h").exists():
        pytest.skip("this torch has no c10/cuda headers")
    stub = tmp_path / "stub"
    macros = include / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h"
    if not macros.exists():
        (stub / "c10" / "cuda" / "impl").mkdir(parents=True)
        (stub / "c10" / "cuda" / "impl" / "cuda_cmake_macros.h").write_text(
            "#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n")
    homes = [os.environ.get("CUDA_HOME"), Path(NVCC).resolve().parents[1], "/usr/local/cuda"]
    found = [Path(h) / "include" for h in homes
             if h and (Path(h) / "include" / "cuda_runtime.h").exists()]
    if not found:
        pytest.skip("cuda_runtime.h not found (set CUDA_HOME)")
    cuda_include = found[0]
    cmd = [cxx, "-std=c++20", "-fsyntax-only", f"-I{include}",
           f"-I{include / 'torch' / 'csrc' / 'api' / 'include'}", f"-I{stub}",
           f"-I{cuda_include}", f"-I{sysconfig.get_paths()['include']}", str(CSRC / "bindings.cpp")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
