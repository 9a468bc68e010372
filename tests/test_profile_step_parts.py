"""benchmarks/profile_step_parts.py: py-spy samples go to the innermost frame that names a part,
samples outside engine steps are left out, and the table shows the extra per speculative step."""
from __future__ import annotations

import pytest

from benchmark_modules import load_benchmark

parts = load_benchmark("profile_step_parts")

STEP = "main (x.py:1);LLMEngine.step (llm_engine.py:2);EngineCore.step (core.py:3)"
RAW = "\n".join([
    f"{STEP};GPUModelRunner._model_forward (gpu_model_runner.py:9);mm (ops.py:1) 50",
    # the sampler patch calls tree acceptance, which asks budget control: the innermost part wins
    f"{STEP};GPUModelRunner.sample_tokens (g.py:1);TreeProposer.sample (p.py:1);"
    "BudgetControl.observe_verified (b.py:1);ReachCap.observe (r.py:1) 7",
    f"{STEP};GPUModelRunner.sample_tokens (g.py:1);TreeProposer.sample (p.py:1);greedy_walk (g.py:2) 5",
    f"{STEP};Scheduler.schedule (scheduler.py:1) 3",
    f"{STEP};somewhere_else (y.py:1) 2",
    "main (x.py:1);LLM.__init__ (llm.py:1) 1000",            # start-up: not inside a step
    "garbage line",
])


def test_samples_go_to_the_innermost_part_inside_steps():
    counted, total = parts.classify(RAW)
    assert total == 67
    assert counted == {"model forward": 50, "budget control": 7, "tree acceptance": 5, "scheduler": 3,
                       parts.REST: 2}


def test_the_table_reports_the_extra_of_a_speculative_step():
    record = {"configs": [
        {"config": "off", "ms_per_step": 4.0, "steps": 100, "speculative_share": 0.0, "tokens": 100,
         "step_samples": 400, "parts_ms_per_step": {"model forward": 3.0, parts.REST: 1.0}},
        {"config": "tree", "ms_per_step": 5.0, "steps": 50, "speculative_share": 0.5, "tokens": 100,
         "step_samples": 500, "parts_ms_per_step": {"model forward": 3.5, "tree acceptance": 0.5,
                                                    parts.REST: 1.0},
         "extra_ms_per_speculative_step": {"model forward": 1.0, "tree acceptance": 1.0, parts.REST: 0.0}},
    ]}
    text = parts.table(record)
    assert "| tree acceptance | 0.000 | 0.500 | 1.000 |" in text
    assert "| **step** | **4.000** | **5.000** | **2.000** |" in text
    assert "| speculative share | 0.000 | 0.500 |" in text


def test_a_missing_py_spy_is_named(capsys):
    with pytest.raises(SystemExit):
        parts.parse_args(["--configs", "off", "--py-spy", "/nonexistent/py-spy"])
    assert "pip install py-spy" in capsys.readouterr().err
