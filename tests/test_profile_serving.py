"""benchmarks/profile_serving.py: py-spy's collapsed stacks -> samples per function and process."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import profile_serving as ps  # noqa: E402

RAW = ('process 1:"python -m vllm_treespec.cli serve m";process 2:"VLLM::Worker";'
       'loop (vllm/x/m.py:3);step (y.py:4);step (y.py:9) 5\n'
       'process 1:"python -m vllm_treespec.cli serve m";handle (z.py:1) 2\n'
       'garbage line\n')


def test_samples_count_once_per_stack_and_go_to_the_innermost_process():
    frames, procs = ps.inclusive_counts(RAW)
    assert frames == {"loop (m.py)": 5, "step (y.py)": 5, "handle (z.py)": 2}   # recursion counted once
    assert procs == {"VLLM::Worker": 5, "API server (vllm_treespec.cli serve m)": 2}


def test_stacks_of_a_single_process_count_every_frame():
    """py-spy without --subprocesses labels no process: the first frame is a function too."""
    frames, procs = ps.inclusive_counts("<module> (run.py:1);step (y.py:4) 3\n")
    assert frames == {"<module> (run.py)": 3, "step (y.py)": 3}
    assert procs == {ps.SINGLE_PROCESS: 3}
