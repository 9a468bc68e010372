"""Served step clock: sums the seconds of a vLLM server's step parts into a file.

Loaded by Python at start-up in every process of a server launched with this directory first on
PYTHONPATH and `TREESPEC_FORWARD_CLOCK` naming a file (`harness.forward_clock.clock_env`). When
one of vLLM's modules below is imported, the named methods are wrapped to add each call's
seconds and count to two doubles of their slot in that file, written through a shared mapping
so the benchmark reads them between turns without asking the server. Why: on a shared 2-core
VM the machine's speed drifts by tens of percent between turns, and the forward of the same rows
is the yardstick that cancels it (slot 0, `bench_paired`'s drift correction, served); the other
slots say in which process and part a config's extra time per token goes.

The wrapped methods are the callers of what the plugin patches (the worker's `execute_model`
calls the runner's), so the plugin's own work is inside them. Inside the worker's sample call
three more say where its time goes: the plugin's drafting call (`TreeProposer.propose_step`, looked
up at each call, so the clock sees it, or in a quiet stretch's step `take_quiet_step`), and
vLLM's own sampler (`_sample`: wrapped on import, under the plugin's patch, so only vLLM's
sampling is timed) and bookkeeping. Slots must match
`harness.forward_clock.SLOTS`. Does nothing when the variable is unset, and never lets a clock
failure reach the server.
"""
from __future__ import annotations

import importlib.abc
import importlib.util
import os
import sys

_PATH = os.environ.get("TREESPEC_FORWARD_CLOCK")
_SLOT_BYTES = 16
# module -> [(class, method, slot)]; slot order is harness.forward_clock.SLOTS
_TARGETS: dict[str, list[tuple[str, str, int]]] = {
    "vllm.v1.worker.gpu_model_runner": [("GPUModelRunner", "_model_forward", 0),
                                        ("GPUModelRunner", "_sample", 9), ("GPUModelRunner", "_bookkeeping_sync", 10)],
    "vllm.v1.worker.gpu_worker": [("Worker", "execute_model", 1), ("Worker", "sample_tokens", 2)],
    "vllm.v1.core.sched.scheduler": [("Scheduler", "schedule", 3), ("Scheduler", "update_from_output", 4)],
    "vllm.v1.engine.core": [("EngineCoreProc", "_process_engine_step", 5), ("EngineCore", "post_step", 6)],
    "vllm.v1.engine.output_processor": [("OutputProcessor", "process_outputs", 7)],
    "vllm_treespec.engine.proposer": [("TreeProposer", "propose_step", 8), ("TreeProposer", "take_quiet_step", 8)],
}
_NUM_SLOTS = 1 + max(slot for targets in _TARGETS.values() for *_, slot in targets)
_STATE: dict = {"pid": None, "map": None, "sums": None}


def _mapping():
    if _STATE["pid"] != os.getpid():          # first call in this process (or after a fork)
        with open(_PATH, "r+b") as f:
            _STATE["map"] = mmap.mmap(f.fileno(), _SLOT_BYTES * _NUM_SLOTS)
        _STATE["pid"], _STATE["sums"] = os.getpid(), [[0.0, 0] for _ in range(_NUM_SLOTS)]
    return _STATE["map"]


def _timed(original, slot: int):
    def timed(self, *args, **kwargs):
        try:
            clock = _mapping()
        except Exception:                       # a clock must never break the server
            clock = None
        start = time.perf_counter()
        try:
            return original(self, *args, **kwargs)
        finally:
            if clock is not None:
                sums = _STATE["sums"][slot]
                sums[0] += time.perf_counter() - start
                sums[1] += 1
                struct.pack_into("dd", clock, slot * _SLOT_BYTES, sums[0], float(sums[1]))

    timed.__name__ = original.__name__
    timed.__wrapped__ = original
    return timed


def _wrap(module) -> None:
    for cls_name, method, slot in _TARGETS[module.__name__]:
        cls = getattr(module, cls_name, None)
        original = getattr(cls, method, None) if cls is not None else None
        if original is not None:
            setattr(cls, method, _timed(original, slot))


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the real loader of each target module so the patch runs right
    after it executes."""

    def find_spec(self, name, path=None, target=None):
        if name not in _TARGETS:
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
            try:
                _wrap(module)
            except Exception:                   # a clock must never break the server
                pass

        spec.loader.exec_module = exec_then_patch
        return spec


if _PATH:
    import mmap
    import struct
    import time

    sys.meta_path.insert(0, _PatchAfterImport())
