"""Per-request tree-build latency of every builder, Python and C++ paths.

Settings:
  * DART defaults: depth table with d=8 levels, k=25 candidates per level, beam width w=20,
    theta=59 kept nodes, DART COMBINE scoring against a 3-gram table (DART App. D);
  * JetSpec-style budgets 64 / 128 / 256 over a d=16, k=10 table (accumulated log-prob);
  * static / threshold / chain at the same budgets for reference.

Every build goes through the public `build_tree` (what the proposer will call), on a process
pinned to one core, cycling over 8 different random tables; the table reports median and p90 per
request. The acceptance-rule latency comes from `harness.accept_latency.accept_latency` (not
measured with --quick). Output: a table, then the JSON record as the
LAST line; the record is also written to benchmarks/results/bench_tree.json.

    .venv/bin/python benchmarks/bench_tree.py            # ~1 minute
    .venv/bin/python benchmarks/bench_tree.py --quick    # fewer repetitions, no acceptance rules
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
try:
    import vllm_treespec  # noqa: F401  (installed, or on PYTHONPATH)
except ImportError:
    sys.path.insert(0, str(ROOT))

from harness.report import cpu_model  # noqa: E402
from vllm_treespec.tree import (DepthTable, NgramTable, TreeBatch, build_tree,  # noqa: E402
                                builder_params)

TARGET_MS = 0.5
VOCAB = 32000


def git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, text=True,
                              capture_output=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def make_table(rng: np.random.Generator, depth: int, k: int, rho=None) -> DepthTable:
    """Peaked per-depth distributions that flatten with depth, like a trained head's (median
    top-1 probability ~0.6 at depth 1, ~0.2 at depth 16)."""
    tokens = np.stack([rng.choice(VOCAB, size=k, replace=False) for _ in range(depth)])
    rows = []
    for d in range(depth):
        logits = rng.normal(size=500) * (5.5 - 0.2 * d)
        lp = logits - np.log(np.sum(np.exp(logits - logits.max()))) - logits.max()
        rows.append(np.sort(lp)[::-1][:k])
    return DepthTable(tokens, np.stack(rows), root=int(rng.integers(VOCAB)),
                      context=rng.integers(VOCAB, size=8).tolist(), rho=rho)


def make_ngram(rng: np.random.Generator, tables_tokens: list[np.ndarray], order: int = 3,
               entries: int = 40000) -> NgramTable:
    """A 3-gram table over the tables' tokens (so lookups hit at every backoff level)."""
    pool = np.unique(np.concatenate([t.reshape(-1) for t in tables_tokens]))
    ng = NgramTable(order=order, floor=float(np.log(1e-10)))
    for _ in range(entries):
        n = int(rng.integers(0, order))
        ng.add(tuple(rng.choice(pool, size=n).tolist()), int(rng.choice(pool)),
               float(-rng.exponential(3.0)))
    return ng


def time_builds(fn, tables, reps: int) -> tuple[float, float, int]:
    """(median ms, p90 ms, nodes) of fn(table) over `reps` calls cycling through `tables`."""
    for t in tables:  # warm-up
        fn(t)
    times = np.empty(reps)
    nodes = 0
    for i in range(reps):
        t = tables[i % len(tables)]
        start = time.perf_counter_ns()
        tree = fn(t)
        times[i] = (time.perf_counter_ns() - start) / 1e6
        nodes = tree.num_draft
    return float(np.median(times)), float(np.percentile(times, 90)), nodes


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, no acceptance rules")
    ap.add_argument("--reps", type=int, default=None, help="timed builds per row (C++ rows)")
    ap.add_argument("--accept-batch-sizes", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--output", type=Path, default=ROOT / "benchmarks/results/bench_tree.json")
    args = ap.parse_args(argv)
    reps_cpp = args.reps or (200 if args.quick else 2000)
    reps_py = max(10, reps_cpp // 10)

    rng = np.random.default_rng(0)
    dart_tables_plain = [make_table(rng, 8, 25) for _ in range(8)]
    ngram = make_ngram(rng, [t.tokens for t in dart_tables_plain])
    with_rho = lambda tabs, rho: [DepthTable(t.tokens, t.logprobs, t.root, t.context, rho)  # noqa
                                  for t in tabs]
    dart_py = with_rho(dart_tables_plain, ngram)            # Python dict n-gram (reference)
    dart_cpp = with_rho(dart_tables_plain, ngram.native())  # C++ twin, same entries
    jet = [make_table(rng, 16, 10) for _ in range(8)]

    rows = []

    def run(builder, setting, tables, budget, backend, **params):
        if "backend" in builder_params(builder):  # builders without a C++ path run Python
            params["backend"] = backend
        reps = reps_cpp if backend != "python" else reps_py
        med, p90, nodes = time_builds(lambda t: build_tree(builder, t, budget, **params),
                                      tables, reps)
        rows.append(dict(builder=builder, setting=setting, budget=budget,
                         backend=backend, median_ms=med, p90_ms=p90, nodes=nodes))

    cpu = None
    if hasattr(os, "sched_setaffinity"):
        old_affinity = os.sched_getaffinity(0)
        cpu = min(old_affinity)
        os.sched_setaffinity(0, {cpu})
    try:
        dart = dict(width=20, topk=25, scorer="dart")
        run("beam", "DART d8 k25 w20 dart+3gram", dart_cpp, 59, "cpp", **dart)
        run("beam", "DART d8 k25 w20 dart+3gram", dart_py, 59, "python", **dart)
        run("beam", "DART d8 k25 w20 acc_logp", dart_tables_plain, 59, "cpp", width=20, topk=25)
        run("beam", "DART d8 k25 w20 acc_logp", dart_tables_plain, 59, "python", width=20,
            topk=25)
        run("beam", "DART d8 k25 w20 presto+3gram", dart_cpp, 59, "cpp", width=20, topk=25,
            scorer="presto")
        run("best_first", "DART d8 k25 acc_logp", dart_tables_plain, 59, "cpp")
        run("best_first", "DART d8 k25 acc_logp", dart_tables_plain, 59, "python")
        for budget in (64, 128, 256):
            setting = "JetSpec d16 k10"
            run("best_first", setting + " acc_logp", jet, budget, "cpp")
            run("best_first", setting + " acc_logp", jet, budget, "python")
            run("best_first", setting + " acc_logp spine", jet, budget, "cpp", greedy_spine=True)
            run("beam", setting + " w20 acc_logp", jet, budget, "cpp", width=20)
            run("beam", setting + " w20 acc_logp", jet, budget, "python", width=20)
            run("threshold", setting + " B3 tau.03", jet, budget, "python",
                branch=3, max_depth=16, tau=0.03)
            run("static", setting + " (4,3,2,2,2,1,1,1)", jet, budget, "python",
                template=(4, 3, 2, 2, 2, 1, 1, 1))
        run("static", "Mamba (3,2,2,1)", jet, 64, "python", template=(3, 2, 2, 1))
        run("chain", "d8", dart_tables_plain, 8, "python")
        # Per-step glue the proposer also pays: DepthTable validation, batching 32 trees.
        glue = {
            ("DepthTable()", "d8 k25 validation", 0): lambda: DepthTable(
                t0.tokens, t0.logprobs, t0.root, t0.context),
            ("TreeBatch.from_trees", "32 trees x 64 nodes", 64): lambda: TreeBatch.from_trees(
                batch),
        }
        t0 = dart_tables_plain[0]
        batch = [build_tree("best_first", t, 64) for t in jet] * 4
        for (name, setting, budget), fn in glue.items():
            fn()
            times = []
            for _ in range(reps_py):
                start = time.perf_counter_ns()
                fn()
                times.append((time.perf_counter_ns() - start) / 1e6)
            rows.append(dict(builder=name, setting=setting, budget=budget, backend="python",
                             median_ms=float(np.median(times)),
                             p90_ms=float(np.percentile(times, 90)), nodes=budget))
    finally:
        if cpu is not None:
            os.sched_setaffinity(0, old_affinity)

    def fastest(builder, setting_prefix, budget, backend=None):
        return min(r["median_ms"] for r in rows if r["builder"] == builder
                   and r["setting"].startswith(setting_prefix) and r["budget"] == budget
                   and backend in (None, r["backend"]))

    accept = "not available"
    if not args.quick:
        from harness.accept_latency import accept_latency

        try:
            accept = accept_latency(args.accept_batch_sizes, threads=1)
        except Exception as e:  # noqa: BLE001 - reported, never fatal for this benchmark
            accept = f"error: {type(e).__name__}: {e}"

    print(f"{'builder':<22}{'setting':<38}{'budget':>7}{'backend':>9}{'median ms':>11}"
          f"{'p90 ms':>9}{'nodes':>7}")
    for r in rows:
        print(f"{r['builder']:<22}{r['setting']:<38}{r['budget']:>7}{r['backend']:>9}"
              f"{r['median_ms']:>11.4f}{r['p90_ms']:>9.4f}{r['nodes']:>7}")
    if isinstance(accept, dict):
        print("acceptance rules (harness.accept_latency, median ms per call):")
        for mode, per in accept.get("results", {}).items():
            print("  " + mode + ": " + ", ".join(f"B={b}: {v['median_ms']:.3f}"
                                                 for b, v in per.items()))
    else:
        print(f"acceptance rules: {accept}")

    cpp_beam = fastest("beam", "DART d8 k25 w20 dart", 59, "cpp")
    bf256 = fastest("best_first", "JetSpec d16 k10 acc_logp", 256)  # fastest shipped path
    record = {
        "benchmark": "bench_tree",
        "unit": "ms per request (median)",
        "cpp_beam_dart_defaults_ms": cpp_beam,
        "best_first_256_ms": bf256,
        "targets_ms": {"cpp_beam_dart_defaults_ms": TARGET_MS, "best_first_256_ms": TARGET_MS},
        "meets_targets": bool(cpp_beam <= TARGET_MS and bf256 <= TARGET_MS),
        "accept_latency": accept,
        "rows": rows,
        "hardware": {"cpu_model": cpu_model(), "cores": os.cpu_count(), "pinned_core": cpu,
                     "machine": platform.machine()},
        "software": {"python": platform.python_version(), "numpy": np.__version__},
        "commit": git_commit(),
        "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "settings": {"vocab": VOCAB, "tables": 8, "reps_cpp": reps_cpp, "reps_python": reps_py,
                     "ngram_entries": len(ngram), "ngram_order": 3},
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record))
    return record


if __name__ == "__main__":
    main()
