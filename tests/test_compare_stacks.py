"""benchmarks/compare_stacks.py: py-spy raw stacks -> per-function shares of the model forward."""
from __future__ import annotations

from tests.benchmark_modules import load_benchmark

cs = load_benchmark("compare_stacks")

FWD = "GPUModelRunner._model_forward (vllm/v1/worker/gpu_model_runner.py:3620)"


def _write(tmp_path, name, lines):
    path = tmp_path / name
    path.write_text("\n".join(lines) + "\n")
    return path


def test_shares_are_of_each_profiles_forward_and_counted_once_per_stack(tmp_path, capsys):
    a = _write(tmp_path, "a.txt", [f"step (core.py:1);{FWD} 8", "step (core.py:1);sample (s.py:2) 2"])
    b = _write(tmp_path, "b.txt", [f"step (core.py:1);{FWD} 4",
                                   "step (core.py:1);propose (p.py:3);propose (p.py:9) 2"])   # recursion: once
    counts = cs.inclusive_samples(b)
    assert counts["propose (p.py)"] == 2 and counts["step (core.py)"] == 6
    assert cs.main([str(a), str(b), "--labels", "off", "on"]) == 0
    out = capsys.readouterr().out
    assert "| `propose (p.py)` | 0.00 | 50.00 | +50.00 |" in out       # 2 of b's 4 forward samples
    assert "| `sample (s.py)` | 25.00 | 0.00 | -25.00 |" in out
    assert "| `step (core.py)` | 125.00 | 150.00 | +25.00 |" in out


def test_a_profile_without_a_forward_is_refused(tmp_path):
    import pytest

    a = _write(tmp_path, "a.txt", ["step (core.py:1) 3"])
    with pytest.raises(SystemExit, match="no GPUModelRunner._model_forward"):
        cs.main([str(a), str(a)])
