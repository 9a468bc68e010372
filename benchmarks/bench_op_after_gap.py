"""Cost of one small torch op when other work or idle time comes before it, on this CPU.

Why: in the serving engine the draft LM's `F.linear` calls averaged 46.6 us (cProfile of
`profile_offline.py` with the draft-model chain), while a tight loop of the same shapes measures
4-9 us. The engine runs each op after Python glue or a wait, never back to back. This
benchmark times a 1 x 128 x 256 linear (the draft LM's q/k/v shape) after each kind of gap, with
one torch thread so thread wake-ups play no part:

    .venv/bin/python benchmarks/bench_op_after_gap.py --output benchmarks/results/bench_op_after_gap.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def time_after(gap: Callable[[], None], op: Callable[[], object], trials: int, warmup: int = 30) -> float:
    """Median microseconds of `op` when `gap` runs right before each call."""
    samples = []
    for i in range(trials + warmup):
        gap()
        start = time.perf_counter()
        op()
        if i >= warmup:
            samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=300)
    p.add_argument("--output", type=Path, default=None, help="JSON record path")
    args = p.parse_args()
    torch.set_num_threads(1)
    x, w = torch.randn(1, 128), torch.randn(256, 128)
    junk = np.zeros(8 << 20, dtype=np.uint8)
    op = lambda: F.linear(x, w)                                     # noqa: E731
    gaps: dict[str, Callable[[], None]] = {
        "none (back to back)": lambda: None,
        "1 ms busy Python loop": lambda: _spin(1e-3),
        "5 ms busy Python loop": lambda: _spin(5e-3),
        "5 ms sleep (idle core)": lambda: time.sleep(5e-3),
        "write 8 MB (evicts caches)": lambda: junk.fill(1),
        "5 ms busy loop, then one warm-up op": lambda: (_spin(5e-3), op()),
    }
    rows = {}
    with torch.inference_mode():
        for name, gap in gaps.items():
            rows[name] = round(time_after(gap, op, args.trials), 2)
            print(f"{name:40s} {rows[name]:8.1f} us")
    if args.output:
        record = {"benchmark": "bench_op_after_gap", "op": "F.linear 1x128 @ 128x256, float32, 1 thread",
                  "statistic": f"median of {args.trials} calls", "us_after_gap": rows,
                  "hardware": {"cpu_count": os.cpu_count(), "platform": platform.platform(),
                               "loadavg_1_5_15": list(os.getloadavg())},
                  "software": {"torch": torch.__version__}}
        args.output.write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {args.output}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
