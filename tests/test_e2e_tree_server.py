"""Tree speculation through the OpenAI server (`vllm-treespec serve`): greedy outputs equal a
server without speculation at concurrency 8, requests aborted mid-stream leave the server
healthy and later outputs unchanged, and the tree series reach /metrics consistently with
vLLM's own spec-decode counters and labelled with the same model_name."""
from __future__ import annotations

import http.client
import json
import re
import time
import urllib.error
import urllib.request
from urllib.parse import urlparse

import pytest

from vllm_treespec.train.corpus import held_out_prompts

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

K = 16
TREE_ARGS = ("--speculative-config", json.dumps({"model": "vllm_treespec.TreeProposer", "num_speculative_tokens": K}),
             "--additional-config", json.dumps({"treespec": "prompt-lookup-tree"}))
PROMPTS = held_out_prompts(16, 400, seed=21)
TREE_SAMPLES = ("treespec_tree_nodes_count", "treespec_accepted_depth_sum", "treespec_draft_seconds_count",
                "treespec_verify_seconds_count", "treespec_budget_nodes_count",
                "treespec_budget_chosen_nodes",
                "treespec_reach_cap_nodes",         # prompt-lookup-tree sets budget.reach_floor
                "treespec_gain_decisions_total", "treespec_gain_step_seconds")   # and budget.gain


def _abort_mid_stream(base_url: str, model: str, prompt: str, chunks: int = 3) -> int:
    """Stream a completion, read `chunks` events, then drop the connection; returns events read."""
    url = urlparse(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=60)
    body = json.dumps({"model": model, "prompt": prompt, "max_tokens": 200, "temperature": 0.0,
                       "stream": True, "ignore_eos": True})
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    assert resp.status == 200
    seen = 0
    while seen < chunks:
        line = resp.readline()
        if line.startswith(b"data:"):
            seen += 1
    conn.close()     # the server aborts the request when the client goes away
    return seen


def _metric_sums(base_url: str) -> tuple[dict[str, float], dict[str, set[str]]]:
    """Each series summed over its labels, and the model_name values seen on each series."""
    text = urllib.request.urlopen(base_url + "/metrics", timeout=10).read().decode()
    sums: dict[str, float] = {}
    models: dict[str, set[str]] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if m:
            sums[m.group(1)] = sums.get(m.group(1), 0.0) + float(m.group(3))
            models.setdefault(m.group(1), set()).update(re.findall(r'model_name="([^"]*)"', m.group(2) or ""))
    return sums, models


def _post_with_xargs(base_url: str, model: str, xargs: dict) -> tuple[int, str]:
    """Status and body of a short completion carrying `vllm_xargs`."""
    body = json.dumps({"model": model, "prompt": "def f(x):", "max_tokens": 8, "temperature": 0.0,
                       "vllm_xargs": xargs}).encode()
    req = urllib.request.Request(base_url + "/v1/completions", body, {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.fixture(scope="module")
def served(code_lm_model):
    from harness.serving import run_load, serve

    results = {}
    for name, args in (("off", ()), ("tree", TREE_ARGS)):
        with serve(code_lm_model, args) as server:
            first = run_load(server, PROMPTS, max_tokens=48, concurrency=8)
            time.sleep(1.0)   # the last step's stats reach the API server after its outputs
            metrics, models = _metric_sums(server.base_url)   # before the aborts: both sides complete
            aborted = [_abort_mid_stream(server.base_url, server.model, p) for p in PROMPTS[:4]]
            second = run_load(server, PROMPTS, max_tokens=48, concurrency=8)
            xargs = [_post_with_xargs(server.base_url, server.model, x) for x in
                     ({"treespec_max_nodes": -1}, {"treespec_max_nodez": 2},
                      {"treespec_max_nodes": 0})]
            health = urllib.request.urlopen(server.base_url + "/health", timeout=10).status
        results[name] = dict(first=[r.output_key() for r in first.requests],
                             second=[r.output_key() for r in second.requests],
                             aborted=aborted, metrics=metrics, models=models, model=server.model,
                             health=health, xargs=xargs)
    return results


def test_served_tree_outputs_equal_no_spec(served):
    assert served["tree"]["first"] == served["off"]["first"]
    assert served["tree"]["second"] == served["off"]["second"]


def test_aborted_streams_leave_server_healthy_and_outputs_unchanged(served):
    tree = served["tree"]
    assert tree["aborted"] == [3, 3, 3, 3] and tree["health"] == 200
    assert tree["second"] == tree["first"]


def test_tree_series_on_metrics_agree_with_vllm_counters(served):
    m = served["tree"]["metrics"]
    for name in TREE_SAMPLES:
        assert m.get(name, 0) > 0, f"{name} missing from /metrics"
    # accepted = path lengths on both sides; vLLM's drafted also counts its own -1 padding drafts
    assert m["treespec_accepted_depth_sum"] == m["vllm:spec_decode_num_accepted_tokens_total"]
    assert m["treespec_tree_nodes_sum"] <= m["vllm:spec_decode_num_draft_tokens_total"]
    assert m["treespec_accepted_depth_sum"] <= m["treespec_tree_nodes_sum"]
    assert "treespec_tree_nodes_count" not in served["off"]["metrics"]


def test_every_tree_series_is_labelled_with_the_served_model_like_vllms(served):
    tree = served["tree"]
    names = [n for n in tree["models"] if n.startswith("treespec_")]
    assert set(TREE_SAMPLES) <= set(names)
    for name in names:
        assert tree["models"][name] == {tree["model"]}, f"{name}: {tree['models'][name]}"
    assert tree["models"]["vllm:spec_decode_num_accepted_tokens_total"] == {tree["model"]}


def test_bad_per_request_options_get_a_400_naming_the_key(served):
    (bad_status, bad_body), (typo_status, typo_body), (ok_status, _) = served["tree"]["xargs"]
    assert bad_status == 400 and "extra_args.treespec_max_nodes" in bad_body, bad_body
    assert typo_status == 400 and "extra_args.treespec_max_nodez" in typo_body, typo_body
    assert ok_status == 200 and served["tree"]["health"] == 200
