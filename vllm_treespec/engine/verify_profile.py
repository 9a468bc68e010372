"""Startup profile of the target's step time versus query tokens, for `budget.mode: auto`.

Why: the auto policy needs cost(query tokens) to compare budgets; learning it only from served
steps means its first choices at a new batch size are guesses. After vLLM's own warm-up (the
`compile_or_warm_up_model` patch; on CUDA hosts after graph capture, so the timings are the
graphs'), the runner's `_dummy_run` times forwards of 1, 2, 4, ... query tokens up to the largest
verify step the deployment can schedule (max_num_seqs requests of 1 + the largest budget,
capped by max_num_batched_tokens). The points seed the cost model; served steps refine it.

Dummy forwards attend over short dummy contexts, so the profile is the linear-layer part of a
step; the online refinement adds the rest. The RNG state is restored afterwards so seeded sampling
is not shifted by the profile.
"""
from __future__ import annotations

import statistics
import time
from typing import Any

import torch

from vllm_treespec.engine.runner_state import dummy_forward

__all__ = ["profile_sizes", "measure_step_seconds"]


def profile_sizes(max_query_tokens: int) -> list[int]:
    """1, 2, 4, ... below `max_query_tokens`, and `max_query_tokens` itself."""
    if max_query_tokens < 1:
        raise ValueError(f"max_query_tokens must be >= 1, got {max_query_tokens}")
    sizes, q = [], 1
    while q < max_query_tokens:
        sizes.append(q)
        q *= 2
    return sizes + [max_query_tokens]


def _cuda_in_use() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_initialized()


def _synchronize() -> None:
    if _cuda_in_use():
        torch.cuda.synchronize()


def measure_step_seconds(runner: Any, sizes: list[int], repeats: int = 3) -> list[tuple[int, float]]:
    """(query tokens, median seconds of `repeats` timed forwards after one untimed) per size."""
    devices = [torch.cuda.current_device()] if _cuda_in_use() else []
    points = []
    with torch.random.fork_rng(devices=devices):
        for q in sizes:
            dummy_forward(runner, q)
            times = []
            for _ in range(repeats):
                _synchronize()
                start = time.perf_counter()
                dummy_forward(runner, q)
                _synchronize()
                times.append(time.perf_counter() - start)
            points.append((q, statistics.median(times)))
    return points
