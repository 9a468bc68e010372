"""A short headless locust run (benchmarks/locustfile.py through benchmarks/load_sweep.py's
runner) against a code-LM fixture server with treespec on, its auto budget and a chat template:
completions and chat completions, streaming and not, all succeed; TTFT/TPOT are recorded; the
server's spec-decode and treespec series are scraped and show trees verified."""
from __future__ import annotations

import json
import os

import pytest
from benchmark_modules import BENCH, load_benchmark

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_headless_locust_run_has_no_failures(code_lm_model, tmp_path):
    from harness.serving import scrape_spec_metrics, serve

    sweep = load_benchmark("load_sweep")
    flags = sweep.configs(8)["auto"]
    with serve(code_lm_model, ("--max-num-seqs", "8", "--chat-template", str(sweep.CHAT_TEMPLATE), *flags)) as server:
        before = scrape_spec_metrics(server, settle_s=0)
        row = sweep.run_locust(server.base_url, 4, 25, tmp_path,
                               env={"TREESPEC_LOCUST_MAX_TOKENS": "8-32", "TREESPEC_LOCUST_SEED": "3"})
        after = scrape_spec_metrics(server)
        spec = after - before
    assert row["requests"] >= 8 and row["failed"] == 0 and row["locust_failures"] == 0
    assert row["tokens_per_s"] > 0 and row["ttft_p50_ms"] is not None and row["tpot_p50_ms"] is not None
    names = {json.loads(line)["name"] for line in (tmp_path / "requests-u4.jsonl").read_text().splitlines()}
    assert names == {"completion", "completion stream", "chat", "chat stream"}
    assert spec.present and spec.drafts > 0 and spec.tree.get("treespec_budget_nodes_count", 0) > 0
    assert "treespec_budget_chosen_nodes" in after.tree     # the auto policy's latest choice


@pytest.mark.parametrize("value, needle", [("16-x", "need 1 <= lo <= hi"), ("128-16", "need 1 <= lo <= hi"),
                                           ("0-8", "need 1 <= lo <= hi"), ("32,abc", "give positive integers"),
                                           ("", "give positive integers"), ("-5", "need 1 <= lo <= hi")])
def test_bad_max_tokens_knob_names_the_variable(value, needle):
    import subprocess
    import sys

    code = f"import runpy; runpy.run_path({str(BENCH / 'locustfile.py')!r})"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TREESPEC_LOCUST_MAX_TOKENS": value})
    assert out.returncode != 0
    assert f"TREESPEC_LOCUST_MAX_TOKENS={value!r}: {needle}" in out.stderr
