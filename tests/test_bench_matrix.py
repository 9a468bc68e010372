"""benchmarks/bench_matrix.py and benchmarks/unseen_prompts.py: the pure parts (config specs,
turn schedule, ratio arithmetic, mismatch helpers, prompt builder). No server, no engine."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from benchmark_modules import load_benchmark

bm = load_benchmark("bench_matrix")
up = load_benchmark("unseen_prompts")


# -- config specs ----------------------------------------------------------------------------

def _flag(cfg, name):
    return json.loads(cfg.args[cfg.args.index(name) + 1]) if name in cfg.args else None


def test_config_specs():
    off = bm.parse_config("off")
    assert (off.label, off.kind, off.args) == ("off", "off", ())

    ng = bm.parse_config("ngram:12")
    assert ng.label == "ngram K=12"
    assert _flag(ng, "--speculative-config") == {"method": "ngram", "num_speculative_tokens": 12,
                                                 "prompt_lookup_min": 1, "prompt_lookup_max": 4}

    sx = bm.parse_config("suffix:24")
    assert (sx.label, sx.kind) == ("suffix K=24", "suffix")
    assert _flag(sx, "--speculative-config") == {"method": "suffix", "num_speculative_tokens": 24}

    d = bm.parse_config("default:8")        # the plugin's default preset: no treespec key at all
    assert d.label == "default K=8"
    assert _flag(d, "--speculative-config") == {"model": "vllm_treespec.TreeProposer", "num_speculative_tokens": 8}
    assert "--additional-config" not in d.args

    p = bm.parse_config("demo/lookup-trie-distilled:32")
    assert p.label == "demo/lookup-trie-distilled K=32"
    assert _flag(p, "--speculative-config")["num_speculative_tokens"] == 32
    assert _flag(p, "--additional-config") == {"treespec": "demo/lookup-trie-distilled"}

    inline = bm.parse_config('{"drafter": {"type": "prompt_lookup"}, "tree": {"builder": "best_first"}}:16')
    assert inline.label == "inline K=16"
    assert _flag(inline, "--additional-config") == {
        "treespec": {"drafter": {"type": "prompt_lookup"}, "tree": {"builder": "best_first"}}}


@pytest.mark.parametrize("spec, message", [
    ("ngram", "expected off, off-sync, ngram:K"),
    (":8", "expected off, off-sync, ngram:K"),
    ("ngram:0", "K must be a positive integer"),
    ("ngram:-3", "K must be a positive integer"),
    ("suffix:x", "K must be a positive integer"),
    ("{not json:8", "inline treespec JSON does not parse"),
])
def test_bad_config_specs(spec, message):
    with pytest.raises(ValueError) as e:
        bm.parse_config(spec)
    assert message in str(e.value) and repr(spec) in str(e.value)


def test_parse_configs_adds_off_first_and_checks():
    configs = bm.parse_configs(["ngram:4", "default:4"])
    assert [c.label for c in configs] == ["off", "ngram K=4", "default K=4"]
    assert [c.label for c in bm.parse_configs(["ngram:4", "off"])] == ["off", "ngram K=4"]
    with pytest.raises(ValueError, match="repeat"):
        bm.parse_configs(["off", "ngram:4", "ngram:4"])
    with pytest.raises(ValueError, match="not found"):      # a preset that does not exist
        bm.parse_configs(["no-such-preset:8"])
    assert bm.parse_configs(["no-such-preset:8"], check=False)[1].kind == "treespec"


def test_default_dtype_args():
    from harness.serving import CPU_SERVE_ARGS

    args = bm.serve_args_default_dtype(CPU_SERVE_ARGS)
    assert "--dtype" not in args and not any(a.startswith("--dtype") for a in args)
    assert "--enforce-eager" in args and "--max-model-len" in args
    assert bm.serve_args_default_dtype(["--dtype=float32", "-x", "--dtype", "bfloat16", "y"]) == ("-x", "y")


# -- schedule --------------------------------------------------------------------------------

def test_batches():
    assert [len(b) for b in bm.batches(64, 1)] == [8] * 8
    assert [len(b) for b in bm.batches(64, 8)] == [16] * 4
    assert [len(b) for b in bm.batches(64, 32)] == [64]
    assert [len(b) for b in bm.batches(512, 32, waves=8)] == [256, 256]     # a smaller share of drain per turn
    assert [(b.start, b.stop) for b in bm.batches(10, 1)] == [(0, 8), (8, 10)]
    assert [len(b) for b in bm.batches(8, 8)] == [8]            # capped at the prompt count
    assert [len(b) for b in bm.batches(3, 1)] == [3]
    covered = [i for b in bm.batches(37, 4) for i in b]
    assert covered == list(range(37))


def test_prompts_and_waves_per_concurrency():
    """--num-prompts / --waves: one value for every concurrency, or one per --concurrency value;
    anything else is refused naming the flag."""
    assert bm.per_concurrency([2], [1, 8, 32], "--waves") == {1: 2, 8: 2, 32: 2}
    assert bm.per_concurrency([2, 2, 8], [1, 8, 32], "--waves") == {1: 2, 8: 2, 32: 8}
    with pytest.raises(ValueError, match="--waves takes one value or one per --concurrency value"):
        bm.per_concurrency([2, 8], [1, 8, 32], "--waves")
    ns = bm.parse_args(["--configs", "off", "--concurrency", "1", "32", "--num-prompts", "32", "256",
                        "--waves", "2", "8"])
    assert ns.prompts_for == {1: 32, 32: 256} and ns.waves_for == {1: 2, 32: 8}
    assert bm._one_or_per_concurrency(ns.prompts_for) == {"1": 32, "32": 256}
    assert bm._one_or_per_concurrency(ns.waves_for | {1: 8}) == 8
    with pytest.raises(SystemExit):
        bm.parse_args(["--configs", "off", "--concurrency", "1", "8", "--num-prompts", "1", "2", "3"])


def test_prompt_lifetimes_draw_one_pool_per_server_lifetime():
    assert bm.prompt_lifetimes([4, 8], rounds=3) == [[4, 8, 4, 8, 4, 8]]
    assert bm.prompt_lifetimes([4, 8], rounds=3, fresh_servers=True) == [[4, 8], [4, 8], [4, 8]]
    assert bm.prompt_lifetimes([4, 8], rounds=3, shared=True) == [[8]]
    # --fresh-servers temperature: a round's cells (temperature-major) split into one life per temperature
    assert bm.prompt_lifetimes([4, 8, 4, 8], rounds=2, fresh_servers="temperature", lives_per_round=2) == [
        [4, 8], [4, 8], [4, 8], [4, 8]]
    assert bm.parse_args(["--configs", "off", "--fresh-servers"]).fresh_servers == "round"
    assert bm.parse_args(["--configs", "off", "--fresh-servers", "temperature"]).fresh_servers == "temperature"
    assert bm.parse_args(["--configs", "off"]).fresh_servers is None


def test_turn_rotation():
    n = 4
    orders = [bm.turn_order(n, t) for t in range(2 * n)]
    assert orders[0] == [0, 1, 2, 3] and orders[1] == [1, 2, 3, 0]
    for order in orders:
        assert sorted(order) == list(range(n))
    for pos in range(n):       # over n consecutive turns every config takes every position once
        assert sorted(o[pos] for o in orders[:n]) == list(range(n))
    assert orders[n] == orders[0]


def test_start_order():
    n = 3
    assert [bm.start_order(n, life, "given") for life in range(n)] == [[0, 1, 2]] * n
    rotated = [bm.start_order(n, life, "rotate") for life in range(n)]
    assert rotated[1] == [1, 2, 0]
    for pos in range(n):       # over n lifetimes every config starts once in every position
        assert sorted(o[pos] for o in rotated) == list(range(n))
    assert bm.parse_args(["--configs", "off"]).start_order == "given"
    with pytest.raises(SystemExit):      # one lifetime: nothing to rotate, said rather than ignored
        bm.parse_args(["--configs", "off", "--start-order", "rotate"])
    assert bm.parse_args(["--configs", "off", "--fresh-servers", "--start-order", "rotate"]).start_order == "rotate"
    with pytest.raises(ValueError, match="start order"):
        bm.start_order(n, 0, "random")


def test_regimes():
    regs = bm.regimes([0, 0.7, 1.0], [1, 8, 32])
    assert [r.label for r in regs[:4]] == ["greedy c=1", "greedy c=8", "greedy c=32", "T=0.7 c=1"]
    assert regs[-1].label == "T=1 c=32" and not regs[-1].greedy and regs[0].greedy


# -- arithmetic ------------------------------------------------------------------------------

def test_median_index():
    assert bm.median_index([3.0, 1.0, 2.0]) == 2
    assert bm.median_index([4.0, 1.0, 3.0, 2.0]) == 3       # lower middle of an even count
    assert bm.median_index([5.0]) == 0


def test_summarize_cell_ratios_and_median_round():
    rounds = [
        {"off": (1000, 10.0), "a": (1000, 5.0)},     # off 100 tok/s, a 200 -> 2.0x
        {"off": (1000, 20.0), "a": (1000, 8.0)},     # off 50, a 125 -> 2.5x
        {"off": (1000, 12.5), "a": (1000, 8.0)},     # off 80, a 125 -> 1.5625x
    ]
    s = bm.summarize_cell(rounds)
    assert s["a"]["ratio_rounds"] == pytest.approx([2.0, 2.5, 1.5625])
    assert s["a"]["ratio"] == pytest.approx(2.0) and s["a"]["median_round"] == 0
    assert s["a"]["tokens_per_s"] == pytest.approx(200.0)      # the median round's own rate
    assert s["off"]["ratio"] is None and s["off"]["ratio_rounds"] is None
    assert s["off"]["tokens_per_s"] == pytest.approx(80.0) and s["off"]["median_round"] == 2
    two = bm.summarize_cell(rounds[:2])
    assert two["a"]["ratio"] == pytest.approx(2.0)              # lower middle
    assert bm.summarize_cell([{"off": (10, 0.0), "a": (10, 1.0)}])["a"]["ratio"] is None


def test_tau_bound_is_output_tokens_per_drafted_step():
    """A cell whose requests drafted 40 times while returning 200 tokens cannot have had more than
    5 tokens per drafted step, whatever vLLM's accepted counter says."""
    assert bm.tau_bound([(10, 80), (30, 120)]) == pytest.approx(200 / 40)
    assert bm.tau_bound([]) is None and bm.tau_bound([(0, 50)]) is None


def test_pooled_tau():
    assert bm.pooled_tau([(10, 5), (30, 35)]) == pytest.approx(1 + 40 / 40)
    assert bm.pooled_tau([]) is None and bm.pooled_tau([(0, 0)]) is None


def test_first_difference():
    assert bm.first_difference([1, 2, 3], [1, 2, 3]) is None
    assert bm.first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert bm.first_difference([9], [8]) == 0
    assert bm.first_difference([1, 2], [1, 2, 3]) == 2
    assert bm.first_difference([], []) is None


def test_parse_top_logprobs():
    assert bm.parse_top_logprobs({"token_id:7": -0.9, "token_id:3": -0.5, "token_id:4": -0.9}) == [
        (3, -0.5), (4, -0.9), (7, -0.9)]
    with pytest.raises(ValueError, match="token_id"):
        bm.parse_top_logprobs({"def": -0.1})


def test_markdown_table():
    cells = [{"regime": "greedy c=1", "configs": {"ngram K=4": {"ratio": 1.234}, "default K=4": {"ratio": None}}}]
    assert bm.markdown_table(cells, ["ngram K=4", "default K=4"]).splitlines() == [
        "| regime | ngram K=4 | default K=4 |", "|---|---|---|", "| greedy c=1 | 1.23x | - |"]


# -- unseen prompts --------------------------------------------------------------------------

PKGS = ["click", "jinja2"]


@pytest.fixture(scope="module")
def prompts():
    return up.build_prompts(12, seed=5, packages=PKGS)


def test_prompts_are_deterministic(prompts):
    assert up.build_prompts(12, seed=5, packages=PKGS) == prompts
    assert up.build_prompts(12, seed=6, packages=PKGS) != prompts
    assert len({p.text for p in prompts}) == len(prompts)
    assert {p.package for p in prompts} == set(PKGS)             # round robin over the packages
    assert up.prompts_sha256([p.text for p in prompts]) == up.prompts_sha256([p.text for p in prompts])


def test_prompts_are_function_heads(prompts):
    import ast

    for p in prompts:
        assert p.text.startswith(("def ", "async def ")) and p.text.endswith('\n')
        assert up.MIN_CHARS <= len(p.text) <= up.MAX_CHARS
        node = ast.parse(p.text + "    pass\n").body[0]
        assert ast.get_docstring(node)


def test_prompts_never_from_the_stdlib(prompts):
    import json as stdlib_json

    sp = up.site_packages_dirs()
    for p in prompts:
        path = next(s / p.path for s in sp if (s / p.path).exists())
        assert not up.is_stdlib_path(path)
        assert p.path.split("/")[0] not in sys.stdlib_module_names
    assert up.is_stdlib_path(Path(stdlib_json.__file__))
    for name in ("json", "typing_extensions", "importlib_metadata"):
        with pytest.raises(ValueError, match="stdlib"):
            up.package_root(name)
    with pytest.raises(ValueError, match="not installed"):
        up.package_root("surely_no_such_package_here")
    for root in (up.package_root(n) for n in PKGS):
        assert all(not up.is_stdlib_path(f) for f in up.package_files(root.name))
    assert "_vendor" in up.SKIP_DIRS and "_distutils" in up.SKIP_DIRS


def test_function_heads_and_stdlib_copies():
    source = (
        "class A:\n"
        "    def m(self, x: int) -> int:\n"
        '        """Return x doubled, a docstring long enough to pass the length bound of heads."""\n'
        "        return 2 * x\n"
        "\n"
        "    def stub(self):\n"
        '        """Only a docstring: no body to continue, so never a prompt head here."""\n'
        "def short():\n"
        '    """Tiny."""\n'
        "    return 1\n")
    heads = up.function_heads(source, min_chars=40)
    assert [(line, name) for line, name, _ in heads] == [(2, "m")]
    assert heads[0][2].startswith("def m(self, x: int) -> int:\n    \"\"\"Return x")
    assert up.function_heads("def broken(:\n") == []
    # textwrap.dedent's docstring is stdlib text: a verbatim copy is refused
    copied = 'def dedent(text):\n    """Remove any common leading whitespace from every line in `text`.\n    """\n'
    assert up.copied_from_stdlib(copied)
    assert not up.copied_from_stdlib(heads[0][2])


def test_heatmap_writes_png(tmp_path):
    cells = [{"regime": "greedy c=1", "configs": {"ngram K=4": {"ratio": 1.5, "tau": 2.0}, "default K=4": {"ratio": 0.8}}},
             {"regime": "T=1 c=8", "configs": {"ngram K=4": {"ratio": None}, "default K=4": {"ratio": 1.0, "tau": None}}}]
    png = bm.plot_heatmap(cells, ["ngram K=4", "default K=4"], tmp_path / "m.png", "title")
    assert png.read_bytes()[:4] == b"\x89PNG"


def test_off_sync_is_no_speculation_without_async_scheduling():
    cfg = bm.parse_config("off-sync")
    assert cfg.kind == "off-sync" and cfg.label == "off-sync" and cfg.k is None
    assert "--no-async-scheduling" in cfg.args and "--speculative-config" not in cfg.args


def test_paired_ratio_is_the_median_batch_ratio():
    turns = [(100, 1.0, 100, 1.0),      # 1.0x
             (100, 0.5, 100, 1.0),      # 2.0x
             (100, 2.0, 100, 1.0),      # 0.5x (a turn the machine stalled in)
             (120, 1.0, 100, 1.0)]      # 1.2x
    assert bm.paired_ratio(turns) == pytest.approx(1.0)        # lower middle of 0.5, 1.0, 1.2, 2.0
    assert bm.paired_ratio(turns[:3]) == pytest.approx(1.0)
    assert bm.paired_ratio([(5, 0.0, 5, 1.0)]) is None


# -- bootstrap intervals of the cells (benchmarks/matrix_intervals.py) ---------------------------

def _record(ratio_by_turn: dict[str, list[float]], rounds: int = 2) -> dict:
    """A bench_matrix record of a sampled and a greedy cell whose configs' paired turns read the
    given ratios, raw and drift-corrected alike (the same forward seconds on both sides; `off`
    100 tokens in 1 s)."""
    n = len(next(iter(ratio_by_turn.values())))
    off = {"turn_tokens": [100] * n, "turn_seconds": [1.0] * n, "turn_forward_seconds": [0.5] * n}
    configs = {"off": {"rounds": [off] * rounds}}
    for label, ratios in ratio_by_turn.items():
        configs[label] = {"rounds": [{"turn_tokens": [100] * n, "turn_seconds": [1.0 / r for r in ratios],
                                      "turn_forward_seconds": [0.5] * n}] * rounds}
    return {"benchmark": "bench_matrix", "cells": [{"regime": "T=0.7 c=1", "temperature": 0.7, "configs": configs},
                                                   {"regime": "greedy c=1", "temperature": 0.0, "configs": configs}]}


def test_matrix_intervals_resample_the_paired_turns_and_judge_against_the_bar():
    mi = load_benchmark("matrix_intervals")
    rng = __import__("random").Random(1)
    same = [1.0 + rng.uniform(-0.01, 0.01) for _ in range(13)]
    slow = [0.94 + rng.uniform(-0.01, 0.01) for _ in range(13)]
    wide = [0.91 + 0.01 * i for i in range(13)]           # 0.91 .. 1.03 around the bar
    record = _record({"a": same, "b": slow, "c": wide})
    raw = mi.intervals([record], bar=0.97)
    assert [r["regime"] for r in raw] == ["T=0.7 c=1"] * 3 + ["greedy c=1"] * 3      # raw: every cell
    rows = mi.intervals([record], bar=0.97, measure="drift-corrected")
    assert {r["regime"] for r in rows} == {"T=0.7 c=1"}            # greedy cells read the raw ratio
    assert [(r["median"], r["low"], r["high"]) for r in rows] == [(r["median"], r["low"], r["high"]) for r in raw[:3]]
    with pytest.raises(ValueError, match="measure"):
        mi.intervals([record], measure="corrected")
    rows = {r["config"]: r for r in rows}
    assert rows["a"]["turns"] == 26 and rows["a"]["verdict"] == "over"
    assert rows["b"]["verdict"] == "under" and rows["b"]["high"] < 0.96
    assert rows["c"]["verdict"] == "open" and rows["c"]["low"] < 0.97 <= rows["c"]["high"]
    for r in rows.values():
        assert r["low"] <= r["median"] <= r["high"]
    # pooling reruns adds their turns; an interval of more turns is no wider here
    pooled = {r["config"]: r for r in mi.intervals([_record({"c": wide})] * 4)}
    assert pooled["c"]["turns"] == 104
    assert pooled["c"]["high"] - pooled["c"]["low"] <= rows["c"]["high"] - rows["c"]["low"] + 1e-12


def test_steady_turns_pair_the_steady_parts_of_streamed_turns():
    off = {"turn_tokens": [100, 100], "turn_seconds": [1.0, 1.0], "turn_steady": [[80, 0.5], [90, 0.9]]}
    spec = {"turn_tokens": [100, 100], "turn_seconds": [1.25, 1.0], "turn_steady": [[80, 0.4], None]}
    assert bm._steady_turns(spec, off) == [(80, 0.4, 80, 0.5)]      # a turn without a steady part drops out
    assert bm._steady_turns({"turn_tokens": [1]}, off) == []         # a record that did not stream
    assert bm.paired_ratio(bm._steady_turns(spec, off)) == pytest.approx(1.25)
    mi = load_benchmark("matrix_intervals")
    record = {"benchmark": "bench_matrix", "cells": [{"regime": "greedy c=8", "temperature": 0.0, "configs": {
        "off": {"rounds": [off] * 3}, "x": {"rounds": [spec] * 3}}}]}
    (steady,) = mi.intervals([record], measure="steady")
    assert steady["turns"] == 3 and steady["median"] == pytest.approx(1.25)
    (raw,) = mi.intervals([record])
    assert raw["turns"] == 6 and raw["median"] == pytest.approx(0.8)


def test_matrix_intervals_refuse_what_is_not_a_matrix_record(tmp_path, capsys):
    mi = load_benchmark("matrix_intervals")
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"benchmark": "bench_paired"}))
    with pytest.raises(SystemExit):
        mi.main([str(bad)])
    assert "not a bench_matrix record" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        mi.main([str(bad), "--level", "1.5"])
    assert "--level must lie between 0 and 1" in capsys.readouterr().err


def test_cells_carry_the_raw_ratio_interval():
    ratios = [0.9, 1.0, 1.1, 1.2, 0.95]
    low, high = bm.interval_entry(ratios)
    assert low <= bm.lower_middle(ratios) <= high and 0.9 <= low and high <= 1.2
    assert bm.interval_entry([]) is None
    cells = [{"regime": "greedy c=1", "configs": {"x": {"ratio": 1.0, "ratio_interval": [low, high]},
                                                   "y": {"ratio": None}}}]
    table = bm.interval_table(cells, ["x", "y"])
    assert f"1.00x ({low:.2f}-{high:.2f})" in table and "| - |" in table


def test_dtype_flag_replaces_the_cpu_default_dtype():
    """--dtype serves every config in that dtype; without it no --dtype reaches the servers."""
    args = ("--dtype", "float32", "--enforce-eager", "--max-model-len", "1024")
    assert bm.matrix_serve_args(args, None) == ("--enforce-eager", "--max-model-len", "1024")
    assert bm.matrix_serve_args(args, "float32")[-2:] == ("--dtype", "float32")
    assert bm.parse_args(["--configs", "off", "--dtype", "bfloat16"]).dtype == "bfloat16"
