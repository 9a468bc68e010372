"""Helpers for end-to-end tests: run a real vLLM engine in a subprocess and read its outputs."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RUNNER = Path(__file__).with_name("e2e_runner.py")
TREESPEC = "vllm_treespec.TreeProposer"


def run_engine(model: str | Path, engine: dict[str, Any], phases: list[dict[str, Any]],
               inspect_proposer: bool = False, timeout: float = 900, env: dict[str, str] | None = None,
               multiprocess: bool = False) -> dict:
    """Start `LLM(model, **engine)` in a fresh process, run `phases`, return the JSON result.
    Fixtures the config names are built here first, on every core (benchmarks/treespec_fixtures/prebuild.py).

    `multiprocess` (default off): the engine core and the worker run in their own processes, as
    under `vllm serve`; otherwise inside the runner's. vLLM's CPU platform spawns them, and each
    spawn re-imports vLLM (a tiny engine's run: 30.6 s spawned, 13.8 s inside,
    `benchmarks/results/bench_ci_costs.json`). The server tests and the tensor-parallel runs keep
    the spawned layout covered; `inspect_proposer` works in both (e2e_runner takes the flush step
    an in-process engine does not take by itself)."""
    from treespec_fixtures.prebuild import prebuild_engine_fixtures

    prebuild_engine_fixtures(engine, model)
    with tempfile.TemporaryDirectory() as tmp:
        job, out = Path(tmp) / "job.json", Path(tmp) / "out.json"
        job.write_text(json.dumps({"model": str(model), "engine": engine, "phases": phases,
                                   "inspect_proposer": inspect_proposer}))
        log = Path(tmp) / "log.txt"
        with open(log, "w") as f:
            proc = subprocess.run([sys.executable, str(RUNNER), str(job), str(out)], stdout=f,
                                  stderr=subprocess.STDOUT, timeout=timeout,
                                  env={**os.environ, "VLLM_ENABLE_V1_MULTIPROCESSING": "1" if multiprocess else "0",
                                       **(env or {})})
        if proc.returncode != 0 or not out.exists():
            text = log.read_text()
            errors = "\n".join(line for line in text.splitlines() if "Error:" in line)[-3000:]
            raise AssertionError(f"engine run failed (exit {proc.returncode}); errors:\n{errors}\n"
                                 f"log tail:\n{text[-4000:]}")
        result = json.loads(out.read_text())
        result["log"] = log.read_text()
        return result


def greedy(max_tokens: int, **extra: Any) -> dict[str, Any]:
    return {"temperature": 0.0, "max_tokens": max_tokens, **extra}


def spec_config(k: int) -> dict[str, Any]:
    return {"model": TREESPEC, "num_speculative_tokens": k}


def assert_same_outputs(off: dict, on: dict) -> None:
    """Every phase's outputs are bitwise identical (token ids, text, finish reason)."""
    assert [p["name"] for p in off["phases"]] == [p["name"] for p in on["phases"]]
    for p_off, p_on in zip(off["phases"], on["phases"]):
        assert len(p_off["outputs"]) == len(p_on["outputs"])
        for i, (a, b) in enumerate(zip(p_off["outputs"], p_on["outputs"])):
            assert a["token_ids"] == b["token_ids"], f"phase {p_off['name']} request {i}: token ids differ"
            assert a["text"] == b["text"], f"phase {p_off['name']} request {i}: text differs"
            assert a["finish_reason"] == b["finish_reason"], f"phase {p_off['name']} request {i}"
