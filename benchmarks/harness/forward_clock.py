"""Read a served vLLM's summed step-part seconds between turns.

`clock_env(path)` is the environment a server needs so that its processes add the seconds of
every call of a few step parts to `path` (forward_clock_site/sitecustomize.py): the model
forward (the yardstick of drift correction), the worker's execute and sample calls, the engine
core's scheduling, output update, whole step and post-step, and the API server's output
processing, and within the worker's sample call the plugin's drafting call, vLLM's sampler and
its bookkeeping. `read_clock(path)` returns the forward's sums so far, `read_slots(path)` every
part's. A turn's seconds are the difference of two reads around it.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

SITE_DIR = Path(__file__).resolve().parent / "forward_clock_site"
ENV_VAR = "TREESPEC_FORWARD_CLOCK"
# the slots of sitecustomize._TARGETS, in its order
SLOTS = ("forward", "worker_execute", "worker_sample", "schedule", "update_from_output",
         "engine_step", "post_step", "frontend_outputs", "proposer_step", "vllm_sample", "bookkeeping")
_SLOT_BYTES = 16


def new_clock(path: Path) -> Path:
    """Create (or zero) the clock file: two doubles (seconds, calls) per slot."""
    path.write_bytes(bytes(_SLOT_BYTES * len(SLOTS)))
    return path


def clock_env(path: Path) -> dict[str, str]:
    """Environment additions for a server whose forwards `path` should sum."""
    pythonpath = os.environ.get("PYTHONPATH", "")
    return {ENV_VAR: str(path),
            "PYTHONPATH": str(SITE_DIR) + (os.pathsep + pythonpath if pythonpath else "")}


def read_clock(path: Path) -> tuple[float, int]:
    """(forward seconds, forward calls) summed so far by the server writing `path`."""
    return read_slots(path)["forward"]


def read_slots(path: Path) -> dict[str, tuple[float, int]]:
    """(seconds, calls) summed so far per step part (`SLOTS`)."""
    data = path.read_bytes()
    out = {}
    for i, name in enumerate(SLOTS):
        seconds, calls = struct.unpack_from("dd", data, i * _SLOT_BYTES)
        out[name] = (seconds, int(calls))
    return out


def slot_deltas(after: dict[str, tuple[float, int]], before: dict[str, tuple[float, int]]
                ) -> dict[str, tuple[float, int]]:
    """Per-part (seconds, calls) between two reads."""
    return {k: (after[k][0] - before[k][0], after[k][1] - before[k][1]) for k in after}


def drift_corrected(tokens: int, seconds: float, forward_s: float,
                    base_tokens: int, base_seconds: float, base_forward_s: float) -> float | None:
    """Tokens/s ratio to the baseline with each turn's seconds counted in units of its own forward
    seconds: the VM's speed during each turn cancels. Valid where both sides run about the same
    rows; it flatters a config by its extra forward rows (bench_paired's module docstring)."""
    if min(seconds, forward_s, base_seconds, base_forward_s, base_tokens) <= 0:
        return None
    return (tokens / (seconds / forward_s)) / (base_tokens / (base_seconds / base_forward_s))
