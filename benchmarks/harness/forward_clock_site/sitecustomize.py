"""Served forward clock: sums the target model's forward seconds of a vLLM server into a file.

Loaded by Python at start-up in every process of a server launched with this directory first on
PYTHONPATH and `TREESPEC_FORWARD_CLOCK` naming a file (`harness.forward_clock.clock_env`). When
vLLM's model runner module is imported, `GPUModelRunner._model_forward` (the CPU runner inherits
it) is wrapped to add each call's seconds and count to two doubles in that file, written through
a shared mapping so the benchmark reads them between turns without asking the server. Why: on a
shared 2-core VM the machine's speed drifts by tens of percent between turns, and the forward of
the same rows is the yardstick that cancels it (`bench_paired`'s drift correction, served).

Does nothing when the variable is unset, and never lets a clock failure reach the server.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_TARGET = "vllm.v1.worker.gpu_model_runner"
_PATH = os.environ.get("TREESPEC_FORWARD_CLOCK")


def _wrap_forward(module) -> None:
    import mmap
    import struct
    import time

    runner = module.GPUModelRunner
    original = runner._model_forward
    state: dict = {"pid": None, "map": None, "seconds": 0.0, "calls": 0}

    def mapping():
        if state["pid"] != os.getpid():          # first call in this process (or after a fork)
            with open(_PATH, "r+b") as f:
                state["map"] = mmap.mmap(f.fileno(), 16)
            state["pid"], state["seconds"], state["calls"] = os.getpid(), 0.0, 0
        return state["map"]

    def timed_forward(self, *args, **kwargs):
        try:
            clock = mapping()
        except Exception:                       # a clock must never break the server
            clock = None
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            state["seconds"] += time.perf_counter() - start
            state["calls"] += 1
            if clock is not None:
                struct.pack_into("dd", clock, 0, state["seconds"], float(state["calls"]))

    runner._model_forward = timed_forward


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the real loader of `_TARGET` so the patch runs right after."""

    def find_spec(self, name, path=None, target=None):
        if name != _TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_patch(module):
            exec_module(module)
            _wrap_forward(module)

        spec.loader.exec_module = exec_then_patch
        return spec


if _PATH:
    sys.meta_path.insert(0, _PatchAfterImport())
