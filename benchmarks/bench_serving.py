"""Serving benchmark: no speculation vs vLLM's built-in `ngram` vs treespec chains and trees.

One OpenAI server per configuration, all in one run, the same held-out code prompts, greedy,
fixed output length, at each concurrency. Both speculative configs use the same K and the same
n-gram range (1..4), so the comparison is at equal budget and equal algorithm class. Prints a
table and writes a JSON record (hardware, software, commit, model, fixture metadata, settings,
rows) under benchmarks/results/. Exit code 1 when any greedy output differs from no speculation.

    .venv/bin/python benchmarks/bench_serving.py                      # code-lm fixture, K=8, c=1,8
    .venv/bin/python benchmarks/bench_serving.py --fixture tiny --num-prompts 4 --max-tokens 32
    .venv/bin/python benchmarks/bench_serving.py --trees --budgets 8 16 32 64 --ngram-k 4 8

With --trees, every budget B adds (K=B each; --tree-configs picks a subset): chains and trees of
prompt lookup, lookup-trie (prompt lookup mixed with the n-gram trie) and the n-gram trie
(best-first, and beam with the DART scorer); vLLM's ngram runs at every --ngram-k and the
fastest at the lowest concurrency is the reference. Treespec rows also report the worker's
step-time breakdown from the treespec_* series: worker step, drafter + builder, tree attention
(on top of the stock kernel), acceptance and KV compaction, in ms per step.
"""
from __future__ import annotations

import treespec_fixtures  # noqa: F401  (fixture: paths and demo/ presets, here and in servers)
import argparse
import datetime as dt
import json
import sys
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixture", default=None,
                   help="fixture name (default: code-lm if registered, else tiny)")
    p.add_argument("--model-dir", default=None, help="serve this model directory instead of a fixture")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=8)
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--prompt-chars", type=int, default=600)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    p.add_argument("--seed", type=int, default=0, help="prompt sampling seed")
    p.add_argument("--trees", action="store_true", help="add the tree configs at each --budgets value")
    p.add_argument("--budgets", type=int, nargs="+", default=[8, 16, 32, 64])
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat the whole sweep (alternating config order); rows keep each "
                        "config's median round")
    p.add_argument("--tree-configs", nargs="+", default=None, choices=list(TREE_FAMILIES),
                   help="with --trees: only these chain / tree configs (default: all)")
    p.add_argument("--lookup-continue-prob", type=float, nargs="*", default=[],
                   help="with --trees: also prompt-lookup trees with these continue_prob values")
    p.add_argument("--ngram-k", type=int, nargs="+", default=None,
                   help="K values for vLLM's ngram (default: -k); the fastest is the reference")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="sampling temperature of every request (> 0: outputs are not compared)")
    p.add_argument("--output", type=Path, default=None,
                   help="JSON path (default: benchmarks/results/bench_serving_<fixture>_<UTC time>.json)")
    ns = p.parse_args(argv)
    if ns.rounds < 1:
        p.error(f"--rounds must be at least 1, got {ns.rounds}")
    return ns


def resolve_model(ns: argparse.Namespace) -> tuple[str, Path, dict]:
    """(label, model dir, fixture.json contents or {})."""
    from treespec_fixtures import FIXTURES, build_fixture

    if ns.model_dir:
        model_dir = Path(ns.model_dir).resolve()
        label = model_dir.name
    else:
        name = ns.fixture
        if name is None:
            name = "code-lm" if "code-lm" in FIXTURES else "tiny"
            if name == "tiny":
                print("code-lm fixture not registered yet; using `tiny` (random model: "
                      "numbers are not meaningful)", file=sys.stderr)
        model_dir, label = build_fixture(name), name
    meta_path = model_dir / "fixture.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return label, model_dir, meta


TREE_FAMILIES = {   # --tree-configs name -> (preset or inline config, label)
    "prompt-lookup": ("prompt-lookup", None),
    "prompt-lookup-tree": ("prompt-lookup-tree", None),
    "lookup-trie": ("demo/lookup-trie", None),
    "lookup-trie-tree": ("demo/lookup-trie-tree", None),
    "lookup-trie-deep": ("demo/lookup-trie-deep", None),
    # over the self-distilled trie (fixture:code-lm-distill-5gram: code-lm only; not in the
    # default set, name it in --tree-configs)
    "lookup-trie-distilled": ("demo/lookup-trie-distilled", None),
    # lookup-trie with drafter.min_path_prob: no node whose path the drafter rates below it
    "lookup-trie-floor": ({"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram", "min_path_prob": 0.01},
                           "tree": {"builder": "chain", "max_depth": 16}}, "lookup-trie-p0.01"),
    "lookup-trie-tree-floor": ({"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram", "min_path_prob": 0.03},
                                "tree": {"builder": "best_first", "max_depth": 16}}, "lookup-trie-tree-p0.03"),
    "ngram-trie": ("demo/ngram-trie", None),
    "ngram-trie-tree": ("demo/ngram-trie-tree", None),
    "ngram-trie-beam-dart": ({"drafter": {"type": "ngram_trie", "path": "fixture:stdlib-3gram"},
                              "tree": {"builder": "beam", "topk": 4, "width": 4, "max_depth": 8,
                                       "scorer": "dart"}}, "ngram-trie-beam-dart"),
}


OPT_IN_FAMILIES = ("lookup-trie-distilled",)


def tree_configs(budgets: list[int], continue_probs: list[float] = (),
                 families: list[str] | None = None) -> list:
    """Chain vs trees of each drafter at each node budget (K = budget)."""
    from harness.comparison import treespec

    out = []
    for b in budgets:
        out += [treespec(b, TREE_FAMILIES[f][0], label=TREE_FAMILIES[f][1])
                for f in (families or [f for f in TREE_FAMILIES if f not in OPT_IN_FAMILIES])]
        out += [treespec(b, {"drafter": {"type": "prompt_lookup", "max_matches": 8, "continue_prob": p},
                             "tree": {"builder": "best_first"}}, label=f"prompt-lookup-tree-cp{p}")
                for p in continue_probs]
    return out


def fastest(measurements: list, names: list[str], concurrency: int) -> str:
    """The config among `names` with the highest tokens/s at `concurrency`."""
    best = max((m for m in measurements if m.config in names and m.concurrency == concurrency),
               key=lambda m: m.load.tokens_per_s)
    return best.config


def columns() -> list:
    """Table columns (formatters imported here so `--help` stays instant)."""
    from harness.report import fmt_float, fmt_match, fmt_ms, fmt_ratio

    return [("config", "config", str), ("conc", "concurrency", str),
            ("tok/s", "tokens_per_s", fmt_float(1)), ("tau", "tau", fmt_float(2)),
            ("tok/step", "tokens_per_step", fmt_float(2)),
            ("lat mean ms", "latency_mean_s", fmt_ms), ("p50 ms", "latency_p50_s", fmt_ms),
            ("p90 ms", "latency_p90_s", fmt_ms), ("nodes", "mean_tree_nodes", fmt_float(1)),
            ("step ms", "worker_step_ms", fmt_float(2)), ("draft ms", "draft_ms_per_step", fmt_float(3)),
            ("attn ms", "tree_attention_ms_per_step", fmt_float(3)),
            ("accept ms", "accept_ms_per_step", fmt_float(3)), ("compact ms", "compaction_ms_per_step", fmt_float(3)),
            ("exact", "exact_match", fmt_match),
            ("vs off", "speedup_vs_off", fmt_ratio), ("vs ref", "speedup_vs_ref", fmt_ratio)]


def main(argv: list[str] | None = None) -> int:
    from harness.comparison import no_spec, treespec, vllm_ngram

    ns = parse_args(argv)
    k = ns.num_speculative_tokens
    ngram_ks = ns.ngram_k or [k]
    configs = [no_spec(), *[vllm_ngram(nk) for nk in ngram_ks], treespec(k)]
    if ns.trees:
        configs += [c for c in tree_configs(ns.budgets, ns.lookup_continue_prob, ns.tree_configs)
                    if c.name not in {x.name for x in configs}]
    return run_and_record(ns, "bench_serving", configs, [vllm_ngram(nk).name for nk in ngram_ks],
                          extra={"k": k, "ngram_k": ngram_ks},
                          note=f"K={k}; vs off / vs ref = tokens/s ratios at the same concurrency")


def run_and_record(ns: argparse.Namespace, benchmark: str, configs: list, reference_names: list[str],
                   extra: dict, note: str) -> int:
    """Serve every config (ns.rounds rounds, alternating order), print the table, write JSON + PNG.
    The reference is the fastest of `reference_names` at the lowest concurrency. Exit 1 when
    any greedy output differs from no speculation."""
    from harness.comparison import (NGRAM_MAX, NGRAM_MIN, all_match, median_measurements,
                                          run_comparison, summarize)
    from vllm_treespec.train.corpus import held_out_prompts
    from harness.report import (format_table, hardware_info, hardware_line, plot_throughput,
                                      software_info)
    from harness.serving import CPU_SERVE_ARGS

    label, model_dir, meta = resolve_model(ns)
    if "lookup-trie-distilled" in (getattr(ns, "tree_configs", None) or ()):
        from treespec_fixtures.tries import build_trie_fixture

        build_trie_fixture("code-lm-distill-5gram", model_dir)   # before any server starts
    hw = hardware_info()
    print(hardware_line(hw), flush=True)
    prompts = held_out_prompts(ns.num_prompts, ns.prompt_chars, seed=ns.seed)
    warmup = held_out_prompts(max(ns.concurrency), ns.prompt_chars, seed=ns.seed + 1000)
    started = dt.datetime.now(dt.timezone.utc)
    rounds = []
    for r in range(ns.rounds):
        order = configs if r % 2 == 0 else configs[::-1]   # alternate to spread slow phases
        if ns.rounds > 1:
            print(f"round {r + 1} of {ns.rounds}", flush=True)
        rounds.append(run_comparison(str(model_dir), order, prompts, max_tokens=ns.max_tokens,
                                     concurrencies=ns.concurrency, warmup_prompts=warmup,
                                     temperature=ns.temperature))
    greedy = ns.temperature == 0.0
    ok = all(all_match(summarize(ms, baseline="off", compare_outputs=greedy)) for ms in rounds)
    measurements, rates = median_measurements(rounds)
    measurements.sort(key=lambda m: ([c.name for c in configs].index(m.config), m.concurrency))
    ref_name = fastest(measurements, reference_names, min(ns.concurrency))
    rows = summarize(measurements, baseline="off", reference=ref_name, compare_outputs=greedy)
    for row in rows:
        row["tokens_per_s_rounds"] = rates[(row["config"], row["concurrency"])]

    print()
    print(format_table(rows, columns()))
    print(f"\nmodel {model_dir.name}, {len(prompts)} prompts, max_tokens {ns.max_tokens}, reference "
          f"{ref_name}; {note}")

    record = {
        "benchmark": benchmark,
        "started_utc": started.isoformat(timespec="seconds"),
        "hardware": hw,
        "software": software_info(),
        "model": {"dir_name": model_dir.name, "label": label, "fixture": meta},
        "prompts": {"count": len(prompts), "prompt_chars": ns.prompt_chars, "seed": ns.seed,
                    "source": "vllm_treespec.train.corpus.held_out_prompts"},
        "max_tokens": ns.max_tokens,
        **extra,
        "reference": ref_name,
        "ngram_range": [NGRAM_MIN, NGRAM_MAX],
        "concurrencies": ns.concurrency,
        "sampling": {"temperature": ns.temperature, "ignore_eos": True},
        "serve_args": list(CPU_SERVE_ARGS),
        "configs": [{"name": c.name, "args": list(c.args)} for c in configs],
        "rounds": ns.rounds,
        "all_outputs_match": ok,
        "rows": rows,
    }
    out = ns.output or RESULTS_DIR / f"{benchmark}_{label}_{started.strftime('%Y%m%dT%H%M%SZ')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2) + "\n")
    png = plot_throughput(rows, out.with_suffix(".png"), f"{benchmark}, {model_dir.name}, {hardware_line(hw)}")
    print(f"wrote {out} and {png.name}")
    if not ok:
        print("FAIL: some greedy outputs differ from no speculation", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
