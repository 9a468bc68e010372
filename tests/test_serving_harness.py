"""The serving harness behind demo and benchmark: metrics parsing, ratio math, tables (fast), and
one end-to-end check that a served treespec model matches a no-spec server under concurrency."""
from __future__ import annotations

import pytest
from benchmark_modules import load_benchmark

from harness.comparison import (Measurement, all_match, exact_matches, median_measurements,
                                      no_spec, percentile, ratio, summarize, tokens_per_step,
                                      treespec, vllm_ngram)
from harness.report import fmt_float, fmt_match, fmt_ratio, format_table, hardware_info
from harness.serving import LoadResult, RequestResult, SpecMetrics, parse_spec_metrics

MODEL = 'engine="0",model_name="/m"'
METRICS_TEXT = f"""\
# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{{{MODEL}}} 20.0
vllm:spec_decode_num_drafts_created{{{MODEL}}} 1.79e+09
vllm:spec_decode_num_draft_tokens_total{{{MODEL}}} 148.0
vllm:spec_decode_num_draft_tokens_created{{{MODEL}}} 1.79e+09
vllm:spec_decode_num_accepted_tokens_total{{{MODEL}}} 12.0
vllm:spec_decode_num_accepted_tokens_total{{engine="1",model_name="/m"}} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{{MODEL},position="0"}} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{{MODEL},position="1"}} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="1",model_name="/m",position="0"}} 3.0
vllm:spec_decode_num_accepted_tokens_per_pos_created{{{MODEL},position="0"}} 1.79e+09
vllm:num_requests_running{{{MODEL}}} 0.0
"""


# -- metrics parser --------------------------------------------------------------------------

def test_parse_spec_metrics_sums_engines_and_skips_created_gauges():
    m = parse_spec_metrics(METRICS_TEXT)
    assert m.present
    assert (m.drafts, m.draft_tokens, m.accepted) == (20.0, 148.0, 15.0)
    assert m.accepted_per_pos == {0: 12.0, 1: 3.0}
    assert m.tau == pytest.approx(1 + 15 / 20)
    assert m.acceptance_rate == pytest.approx(15 / 148)


def test_parse_spec_metrics_without_speculation():
    m = parse_spec_metrics('vllm:num_requests_running{engine="0"} 0.0\n# comment\n')
    assert not m.present
    assert m.tau is None and m.acceptance_rate is None


def test_metric_deltas_give_window_tau():
    before = SpecMetrics(10, 80, 5, {0: 4, 1: 1}, True)
    after = SpecMetrics(30, 240, 35, {0: 20, 1: 10, 2: 5}, True)
    d = after - before
    assert (d.drafts, d.draft_tokens, d.accepted) == (20, 160, 30)
    assert d.accepted_per_pos == {0: 16, 1: 9, 2: 5}
    assert d.tau == pytest.approx(2.5)


# -- ratio and summary math ---------------------------------------------------------------------

def test_percentile_matches_linear_interpolation():
    xs = [4.0, 1.0, 3.0, 2.0]
    assert percentile(xs, 50) == pytest.approx(2.5)
    assert percentile(xs, 90) == pytest.approx(3.7)
    assert percentile(xs, 0) == 1.0 and percentile(xs, 100) == 4.0
    assert percentile([7.0], 90) == 7.0
    assert percentile([], 50) is None


def test_ratio_and_exact_matches_and_tokens_per_step():
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(1.0, 0.0) is None and ratio(None, 1.0) is None and ratio(1.0, None) is None
    assert exact_matches([(1, 2), (3,)], [(1, 2), (4,)]) == (1, 2)
    with pytest.raises(ValueError):
        exact_matches([(1,)], [])
    assert tokens_per_step(100, 50) == 2.0     # 50 steps each emitting 2 tokens
    assert tokens_per_step(100, 0) == 1.0
    assert tokens_per_step(0, 0) is None


def _load(outputs: list[tuple[int, ...]], wall_s: float, latencies: list[float], c: int = 1) -> LoadResult:
    reqs = [RequestResult(i, "", list(o), len(o), lat) for i, (o, lat) in enumerate(zip(outputs, latencies))]
    return LoadResult(reqs, wall_s, c)


def test_summarize_rows():
    same, other = [(1, 2, 3, 4)] * 2, [(1, 2, 3, 4), (9, 9, 9, 9)]
    ms = [
        Measurement("off", 1, _load(same, 1.0, [0.4, 0.6]), SpecMetrics()),
        Measurement("ngram", 1, _load(same, 0.8, [0.3, 0.5]), SpecMetrics(2, 8, 4, {0: 2, 1: 2}, True)),
        Measurement("tree", 1, _load(other, 0.5, [0.2, 0.3]), SpecMetrics(2, 8, 6, {0: 2}, True)),
    ]
    rows = {r["config"]: r for r in summarize(ms, baseline="off", reference="ngram")}
    assert rows["off"]["tokens_per_s"] == 8.0
    assert rows["off"]["tau"] is None and rows["off"]["tokens_per_step"] is None
    assert rows["off"]["exact_match"] == (2, 2) and rows["off"]["speedup_vs_off"] == 1.0
    assert rows["ngram"]["tau"] == 3.0
    assert rows["ngram"]["tokens_per_step"] == 2.0
    assert rows["ngram"]["speedup_vs_off"] == pytest.approx(1.25)
    assert rows["ngram"]["latency_mean_s"] == pytest.approx(0.4)
    assert rows["ngram"]["latency_p50_s"] == pytest.approx(0.4)
    assert rows["tree"]["exact_match"] == (1, 2)
    assert rows["tree"]["speedup_vs_ref"] == pytest.approx(16 / 10)
    assert not all_match(list(rows.values()))
    assert all_match([rows["off"], rows["ngram"]])


def test_sampled_runs_do_not_compare_outputs():
    ms = [Measurement("off", 1, _load([(1, 2)], 1.0, [1.0]), SpecMetrics()),
          Measurement("tree", 1, _load([(3, 4)], 0.5, [1.0]), SpecMetrics())]
    rows = summarize(ms, baseline="off", compare_outputs=False)
    assert all(r["exact_match"] is None for r in rows) and all_match(rows)
    assert rows[1]["speedup_vs_off"] == pytest.approx(2.0)


def test_summarize_compares_at_equal_concurrency_only():
    out = [(1, 2)]
    ms = [Measurement("off", 1, _load(out, 1.0, [1.0]), SpecMetrics()),
          Measurement("tree", 8, _load(out, 1.0, [1.0], 8), SpecMetrics())]
    row = summarize(ms, baseline="off")[1]
    assert row["exact_match"] is None and row["speedup_vs_off"] is None


def test_config_flags_use_equal_k_and_ngram_range():
    import json

    ngram = json.loads(vllm_ngram(8).args[1])
    assert ngram == {"method": "ngram", "num_speculative_tokens": 8, "prompt_lookup_min": 1,
                     "prompt_lookup_max": 4}
    tree = treespec(8).args
    assert json.loads(tree[1])["num_speculative_tokens"] == 8
    assert json.loads(tree[3]) == {"treespec": "prompt-lookup"}
    from vllm_treespec.config import load_config

    drafter = load_config("prompt-lookup", 8).drafter   # same n-gram range as vLLM's ngram above
    assert (drafter.min_ngram, drafter.max_ngram) == (1, 4)
    assert no_spec().args == ()


# -- report -------------------------------------------------------------------------------------

def test_format_table_aligns_and_shows_missing_values():
    rows = [{"config": "off", "tps": 100.0, "tau": None, "m": (4, 4), "s": 1.0},
            {"config": "treespec K=8", "tps": 1234.5, "tau": 2.345, "m": (3, 4), "s": 1.2345}]
    cols = [("config", "config", str), ("tok/s", "tps", fmt_float(1)), ("tau", "tau", fmt_float(2)),
            ("exact", "m", fmt_match), ("speedup", "s", fmt_ratio)]
    lines = format_table(rows, cols).splitlines()
    assert len(lines) == 4 and len({len(line) for line in lines}) == 1
    assert lines[0].split() == ["config", "tok/s", "tau", "exact", "speedup"]
    assert lines[2].split() == ["off", "100.0", "-", "4/4", "1.00x"]
    assert lines[3].split() == ["treespec", "K=8", "1234.5", "2.35", "3/4", "1.23x"]


def test_hardware_info_has_cpu_and_cores():
    hw = hardware_info()
    assert hw["cpu_model"] and hw["cpu_cores"] >= 1 and hw["usable_cores"] >= 1


# -- end to end ---------------------------------------------------------------------------------

@pytest.mark.e2e
@pytest.mark.slow
def test_served_treespec_matches_no_spec_under_concurrency():
    """Two servers (~30 s each): greedy outputs of treespec prompt lookup equal no speculation at
    concurrency 2, and the spec-decode counters are exported and consistent."""
    from treespec_fixtures import build_fixture
    from vllm_treespec.train.corpus import held_out_prompts
    from harness.serving import run_load, scrape_spec_metrics, serve

    model = build_fixture("tiny")
    prompts = held_out_prompts(4, 400, seed=7)
    outputs = {}
    for cfg in (no_spec(), treespec(4)):
        with serve(model, cfg.args) as server:
            before = scrape_spec_metrics(server, settle_s=0)
            load = run_load(server, prompts, max_tokens=24, concurrency=2)
            delta = scrape_spec_metrics(server) - before
            streamed = run_load(server, prompts, max_tokens=24, concurrency=2, stream=True)
        # a streamed answer is the same answer, every token timed once, inside its request's span
        assert [r.token_ids for r in streamed.requests] == [r.token_ids for r in load.requests]
        assert [r.prompt_token_ids for r in streamed.requests] == [r.prompt_token_ids for r in load.requests]
        for r in streamed.requests:
            assert sum(n for _, n in r.chunks) == r.output_tokens == 24
            assert all(r.start_s <= t <= r.end_s for t, _ in r.chunks)
        # the steady part ends at the third completion: it holds every token of the three
        # requests done by then and may hold all 96 (the last two can finish in one step)
        tokens, seconds = streamed.steady()
        assert 3 * 24 <= tokens <= 4 * 24 and 0 < seconds < streamed.wall_s
        assert load.steady() is None
        assert [r.output_tokens for r in load.requests] == [24] * 4
        assert all(r.token_ids is not None and len(r.token_ids) == 24 for r in load.requests)
        outputs[cfg.name] = [r.output_key() for r in load.requests]
        if cfg.args:
            assert delta.present, "spec-decode counters missing from /metrics"
            assert delta.drafts > 0
            assert 0 <= delta.accepted <= delta.draft_tokens
            assert delta.draft_tokens <= 4 * delta.drafts
            assert sum(delta.accepted_per_pos.values()) == pytest.approx(delta.accepted)
        else:
            assert not delta.present
    assert outputs["off"] == outputs[treespec(4).name]


def _streamed(start: float, end: float, tokens: int) -> RequestResult:
    """A streamed request whose tokens arrived one per equal step over (start, end]."""
    step = (end - start) / tokens
    return RequestResult(index=0, text="", token_ids=[0] * tokens, output_tokens=tokens, latency_s=end - start,
                         start_s=start, end_s=end, chunks=[(start + step * (i + 1), 1) for i in range(tokens)])


def test_steady_part_of_a_load_ends_when_the_first_client_runs_out_of_prompts():
    # two clients, four prompts: client A answers 0-2 s and 2-4 s; client B 0-1 s, 1-5 s. The
    # last prompt goes out at the second completion (2 s), the steady part ends at the third (4 s)
    reqs = [_streamed(0, 2, 10), _streamed(0, 1, 10), _streamed(2, 4, 10), _streamed(1, 5, 40)]
    load = LoadResult(requests=reqs, wall_s=5.0, concurrency=2)
    tokens, seconds = load.steady()
    assert seconds == 4.0
    assert tokens == 10 + 10 + 10 + 30           # B's last request had sent 30 of its 40 tokens by 4 s
    # one client: the whole load; one wave: the first completion
    assert LoadResult(requests=reqs[:2], wall_s=3.0, concurrency=1).steady() == (20, 2.0)
    assert LoadResult(requests=reqs[:2], wall_s=2.0, concurrency=2).steady() == (15, 1.0)
    # a request that was not streamed leaves the load without a steady part
    plain = RequestResult(index=0, text="", token_ids=None, output_tokens=5, latency_s=1.0)
    assert LoadResult(requests=[*reqs, plain], wall_s=5.0, concurrency=2).steady() is None


def test_tree_series_are_parsed_and_windowed():
    text = METRICS_TEXT + """\
treespec_tree_nodes_count 10.0
treespec_tree_nodes_sum 120.0
treespec_tree_nodes_bucket{le="16.0"} 9.0
treespec_draft_seconds_count{pid="7"} 10.0
treespec_draft_seconds_sum{pid="7"} 0.02
treespec_draft_seconds_created{pid="7"} 1.79e+09
"""
    m = parse_spec_metrics(text)
    assert m.tree == {"treespec_tree_nodes_count": 10.0, "treespec_tree_nodes_sum": 120.0,
                      "treespec_draft_seconds_count": 10.0, "treespec_draft_seconds_sum": 0.02}
    assert m.tree_ms_per_step("treespec_draft_seconds") == pytest.approx(2.0)
    assert (m - m).tree_ms_per_step("treespec_draft_seconds") is None
    assert parse_spec_metrics(METRICS_TEXT).tree == {}


def test_median_measurements_keeps_each_rows_median_round():
    out = [(1, 2, 3, 4)]
    rounds = [[Measurement("off", 1, _load(out, wall, [wall]), SpecMetrics()),
               Measurement("tree", 1, _load(out, tree_wall, [tree_wall]), SpecMetrics())]
              for wall, tree_wall in [(1.0, 0.5), (2.0, 0.4), (4.0, 0.2)]]
    chosen, rates = median_measurements(rounds)
    assert [m.config for m in chosen] == ["off", "tree"]
    assert chosen[0].load.wall_s == 2.0 and chosen[1].load.wall_s == 0.4   # median, per row
    assert rates[("off", 1)] == [4.0, 2.0, 1.0]
    two, _ = median_measurements(rounds[:2])                  # even count: the lower middle
    assert two[0].load.wall_s == 2.0


def test_bench_serving_refuses_zero_rounds(capsys):
    bench = load_benchmark("bench_serving")
    with pytest.raises(SystemExit):
        bench.parse_args(["--rounds", "0"])
    assert "--rounds must be at least 1, got 0" in capsys.readouterr().err
    assert bench.parse_args(["--rounds", "3"]).rounds == 3


def test_bench_paired_config_specs():
    bench = load_benchmark("bench_paired")
    assert bench.engine_kwargs("off") == {}
    assert bench.engine_kwargs("ngram:12")["speculative_config"] == {
        "method": "ngram", "num_speculative_tokens": 12, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
    tree = bench.engine_kwargs('{"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram"}}:16')
    assert tree["speculative_config"] == {"model": "vllm_treespec.TreeProposer", "num_speculative_tokens": 16}
    assert tree["additional_config"] == {"treespec": {"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram"}}}
    assert bench.engine_kwargs("lookup-trie-tree:8")["additional_config"] == {"treespec": "lookup-trie-tree"}
    assert bench.engine_kwargs("vllm-draft:4")["speculative_config"] == {
        "method": "draft_model", "model": "fixture:draft-lm", "num_speculative_tokens": 4}
    # the plain-step floor variant: the same engine, the proposer's per-step work left out
    assert bench.engine_kwargs("lookup-online:24@plain-floor") == bench.engine_kwargs("lookup-online:24")
    with pytest.raises(ValueError, match="treespec configs only"):
        bench.engine_kwargs("ngram:12@plain-floor")


def test_bench_paired_plain_floor_takes_every_plain_step_as_an_empty_quiet_step(monkeypatch):
    from types import SimpleNamespace

    from vllm_treespec.engine.proposer import TreeProposer

    bench = load_benchmark("bench_paired")
    for name in ("takes_quiet_step", "take_quiet_step"):          # restored after the test
        monkeypatch.setattr(TreeProposer, name, getattr(TreeProposer, name))
    bench._plain_floor()
    proposer = SimpleNamespace(plain_step=True, drafted=True, step_started_at=1.0)
    assert TreeProposer.takes_quiet_step(proposer, None, None)
    TreeProposer.take_quiet_step(proposer, [[1]])
    assert not proposer.drafted and proposer.step_started_at is None
    proposer.plain_step = False                                     # a step with drafts is not
    assert not TreeProposer.takes_quiet_step(proposer, None, None)


def test_bench_paired_drift_correction_cancels_the_vms_speed():
    """A turn run while the VM is slow is slow in its forward and outside it alike: dividing
    each turn by its own forward leaves each side's work outside the forward per forward."""
    bench = load_benchmark("bench_paired")

    def pair(speed_a, speed_b, overhead_b=0.0):   # forward 1 s at speed 1; A spends 0.5 s outside it
        return {"a_s": 1.5 / speed_a, "a_forward_s": 1.0 / speed_a,
                "b_s": (1.5 + overhead_b) / speed_b, "b_forward_s": 1.0 / speed_b}

    same = [pair(1.0, 0.7), pair(0.8, 1.2), pair(1.1, 1.0)]
    assert bench.drift_corrected(same) == (pytest.approx(1.0), pytest.approx(1.0))
    dearer = [pair(1.0, 0.7, 0.15), pair(0.8, 1.2, 0.15)]        # B spends 10% more per step
    assert bench.drift_corrected(dearer)[0] == pytest.approx(1.5 / 1.65)
    assert bench.drift_corrected([{"a_s": 1.0, "b_s": 1.0}]) == (None, None)   # no forward times


def test_bench_paired_resolves_vllm_draft_fixtures_only(monkeypatch, tmp_path):
    bench = load_benchmark("bench_paired")
    from vllm_treespec.drafters.lm import loading

    monkeypatch.setattr(loading, "resolve_model_dir", lambda path: tmp_path / path.split(":")[-1])
    assert bench.resolved(bench.engine_kwargs("vllm-draft:4"))["speculative_config"]["model"] == str(
        tmp_path / "draft-lm")
    for spec in ("off", "ngram:12", "lookup-trie-tree:8"):
        assert bench.resolved(bench.engine_kwargs(spec)) == bench.engine_kwargs(spec)


@pytest.mark.parametrize("argv, message", [
    (["--b", "lookup-trie"], "expected off, ngram:K, vllm-draft:K or TREESPEC:K"),
    (["--a", "ngram:x"], "expected off, ngram:K, vllm-draft:K or TREESPEC:K"),
    (["--passes", "0"], "--passes must be at least 1, got 0"),
    (["--concurrency", "0"], "--concurrency must be at least 1, got 0"),
    (["--temperature", "-0.5"], "--temperature must be >= 0 (0 = greedy), got -0.5"),
    (["--b", '{"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram", "trie": "x"}}:4'], "drafter.trie: unknown key"),
    (["--a", "no-such-preset:4"], "no-such-preset"),
])
def test_bench_paired_refuses_bad_arguments(argv, message, capsys):
    bench = load_benchmark("bench_paired")
    with pytest.raises(SystemExit):
        bench.parse_args(argv)
    assert message in capsys.readouterr().err


def test_bench_paired_reports_a_dead_engine_instead_of_hanging():
    import multiprocessing as mp

    bench = load_benchmark("bench_paired")
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_exit_at_once, args=(child,), daemon=True)
    proc.start()
    child.close()
    with pytest.raises(RuntimeError, match=r"engine for 'x:4' exited \(code 3\)"):
        bench._receive((parent, proc, "x:4"))


def _exit_at_once(conn) -> None:
    import sys

    sys.exit(3)


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="needs two cores")
def test_pin_frontend_moves_everything_but_the_bound_worker(tmp_path):
    """A stand-in server group: a leader (the API server) and a child bound to one core (the
    OpenMP-bound worker). The leader moves to the other cores, the child keeps its core."""
    import os
    import subprocess
    import sys
    import time

    from harness.serving import Server, group_processes, pin_frontend

    cores = sorted(os.sched_getaffinity(0))
    ready = tmp_path / "ready"
    child = tmp_path / "child.py"
    child.write_text(f"import os, time\nos.sched_setaffinity(0, {{{cores[0]}}})\n"
                     f"open({str(ready)!r}, 'w').close()\ntime.sleep(60)\n")
    parent = tmp_path / "leader.py"
    parent.write_text(f"import subprocess, sys, time\nsubprocess.Popen([sys.executable, {str(child)!r}])\n"
                      "time.sleep(60)\n")
    leader = subprocess.Popen([sys.executable, str(parent)], start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        server = Server("http://127.0.0.1:1", "m", tmp_path / "log", leader)
        pids = group_processes(server)
        assert leader.pid in pids and len(pids) == 2
        assert pin_frontend(server) == {"worker": [cores[0]], "frontend": cores[1:]}
        child = next(p for p in pids if p != leader.pid)
        assert os.sched_getaffinity(leader.pid) == set(cores[1:])
        assert os.sched_getaffinity(child) == {cores[0]}
    finally:
        os.killpg(leader.pid, 9)
        leader.wait()


def test_bench_paired_chat_prompts_are_rendered_with_the_models_chat_template(smollm2_fp32_model):
    bench = load_benchmark("bench_paired")
    from chat_prompts import chat_pool

    prompts = bench.paired_prompts(3, False, str(smollm2_fp32_model))
    pool = chat_pool(0)[:3]
    assert len(prompts) == 3
    for text, chat in zip(prompts, pool):
        # SmolLM2's ChatML template: the user turn, then the opened assistant turn
        assert f"<|im_start|>user\n{chat.content}<|im_end|>" in text
        assert text.endswith("<|im_start|>assistant\n")
    assert bench.parse_args(["--chat", "--dtype", "bfloat16"]).dtype == "bfloat16"
