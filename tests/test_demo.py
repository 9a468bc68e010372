"""`make demo`'s verdict (benchmarks/demo.py): its exit code says whether speculation changed an answer."""
from __future__ import annotations

from benchmark_modules import load_benchmark


def test_demo_exits_1_when_any_greedy_answer_differs(capsys):
    demo = load_benchmark("demo")
    rows = [{"config": "off", "exact_match": (8, 8)}, {"config": "treespec default K=24", "exact_match": (8, 8)}]
    assert demo._exactness(rows, "float32 greedy answers", "SmolLM2-135M-Instruct") == 0
    assert "OK: float32 greedy answers identical to speculation off (SmolLM2-135M-Instruct)" in capsys.readouterr().out
    rows[1]["exact_match"] = (7, 8)
    assert demo._exactness(rows, "float32 greedy answers", "SmolLM2-135M-Instruct") == 1
    assert "FAIL: float32 greedy answers differ" in capsys.readouterr().err
