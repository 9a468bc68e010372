"""Read a served vLLM's summed forward seconds between turns (the yardstick of drift correction).

`clock_env(path)` is the environment a server needs so that its model runner adds every
forward's seconds to `path` (forward_clock_site/sitecustomize.py); `read_clock(path)` returns the
sums so far. A turn's forward seconds are the difference of two reads around it.
"""
from __future__ import annotations

import os
import struct
from pathlib import Path

SITE_DIR = Path(__file__).resolve().parent / "forward_clock_site"
ENV_VAR = "TREESPEC_FORWARD_CLOCK"


def new_clock(path: Path) -> Path:
    """Create (or zero) the 16-byte clock file."""
    path.write_bytes(bytes(16))
    return path


def clock_env(path: Path) -> dict[str, str]:
    """Environment additions for a server whose forwards `path` should sum."""
    pythonpath = os.environ.get("PYTHONPATH", "")
    return {ENV_VAR: str(path),
            "PYTHONPATH": str(SITE_DIR) + (os.pathsep + pythonpath if pythonpath else "")}


def read_clock(path: Path) -> tuple[float, int]:
    """(forward seconds, forward calls) summed so far by the server writing `path`."""
    seconds, calls = struct.unpack("dd", path.read_bytes()[:16])
    return seconds, int(calls)


def drift_corrected(tokens: int, seconds: float, forward_s: float,
                    base_tokens: int, base_seconds: float, base_forward_s: float) -> float | None:
    """Tokens/s ratio to the baseline with each turn's seconds counted in units of its own forward
    seconds: the VM's speed during each turn cancels. Valid where both sides run about the same
    rows; it flatters a config by its extra forward rows (bench_paired's module docstring)."""
    if min(seconds, forward_s, base_seconds, base_forward_s, base_tokens) <= 0:
        return None
    return (tokens / (seconds / forward_s)) / (base_tokens / (base_seconds / base_forward_s))
