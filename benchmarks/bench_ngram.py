"""N-gram trie benchmark: build throughput, size per node, load time, query latency vs a dict trie.

Builds two tries with the fixture tokenizer (the code-LM's when that fixture exists, else tiny):
the Python standard library (training split of the fixture corpus) and every .py file under the
project venv's site-packages. Queries are real contexts from the held-out stdlib files; each gets
k=25 candidates: the true next token plus 24 tokens drawn from the unigram distribution (what a
weak drafter's top-k looks like). The pure-Python baseline is `DictTrie` (nested dicts) holding
the same stdlib counts.

    .venv/bin/python benchmarks/bench_ngram.py                 # full run (a few minutes)
    .venv/bin/python benchmarks/bench_ngram.py --quick         # stdlib + a 24 MB site-packages sample
    .venv/bin/python benchmarks/bench_ngram.py --work-dir DIR --reuse   # re-measure on kept tries

Prints a table; the last line is one JSON object, also written to benchmarks/results/bench_ngram.json.
Targets: <= 16 bytes per node, <= 1 us per context for k=25 candidates batched, load time
independent of file size.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
from harness.report import cpu_model

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "bench_ngram.json"
K = 25




def git_commit() -> str | None:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def bench(fn: Callable[[], Any], *, repeat: int = 15, min_seconds: float = 0.45) -> dict[str, float]:
    """Seconds per call over `repeat` rounds of enough calls to last min_seconds in all.

    Reports the wall-clock median and best round, and the median CPU time of the calling thread.
    On this shared 2-core machine other jobs take turns on the cores: wall time then includes the
    time our thread waits for a core, while thread CPU time (single-threaded calls) does not.
    """
    fn()
    n = 1
    while True:
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if time.perf_counter() - t0 >= min_seconds / repeat or n >= 1 << 20:
            break
        n *= 2
    wall, cpu = [], []
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.thread_time()
        for _ in range(n):
            fn()
        wall.append((time.perf_counter() - t0) / n)
        cpu.append((time.thread_time() - c0) / n)
    return {"median": statistics.median(wall), "best": min(wall), "cpu_median": statistics.median(cpu)}


def us(fn: Callable[[], Any], per: int, **kw: Any) -> dict[str, float]:
    """bench() in microseconds per item, for a call that handles `per` items."""
    return {k: v / per * 1e6 for k, v in bench(fn, **kw).items()}


def tokenizer_dir() -> tuple[Path, str]:
    """The code-LM tokenizer (shared artifact, no model training) when that fixture exists, else tiny's."""
    from treespec_fixtures import FIXTURES, build_fixture

    if "code-lm" in FIXTURES:
        try:
            from treespec_fixtures.code_lm import tokenizer_dir as code_tokenizer_dir
        except ImportError:
            return build_fixture("code-lm"), "code-lm"
        return code_tokenizer_dir(), "code-lm"
    return build_fixture("tiny"), "tiny"


def site_packages_files(limit_mb: float | None) -> list[Path]:
    root = Path(sysconfig.get_paths()["purelib"])
    files = sorted(p for p in root.rglob("*.py") if p.is_file())
    if limit_mb is None:
        return files
    # An evenly spread sample (every j-th file) up to the byte budget, so it covers many packages.
    total = sum(p.stat().st_size for p in files)
    step = max(1, round(total / (limit_mb * 1e6)))
    out, size = [], 0
    for p in files[::step]:
        if size >= limit_mb * 1e6:
            break
        out.append(p)
        size += p.stat().st_size
    return out


def query_set(tok_dir: Path, n: int, vocab: int, unigram: np.ndarray, seed: int = 0):
    """Held-out contexts (last 8 tokens), the true next token, and K candidates per context."""
    from vllm_treespec.train import corpus
    from vllm_treespec.ngram.tokenizer import encode_batch, load_tokenizer

    _, held = corpus.split_files()
    streams = [np.asarray(s, dtype=np.int32) for s in encode_batch(load_tokenizer(tok_dir),
                                                                    [corpus.read_text(p) for p in held])]
    rng = np.random.default_rng(seed)
    streams = [s for s in streams if len(s) > 16]
    contexts = np.empty((n, 8), dtype=np.int32)
    truth = np.empty(n, dtype=np.int32)
    for i in range(n):
        s = streams[rng.integers(len(streams))]
        j = int(rng.integers(8, len(s)))
        contexts[i], truth[i] = s[j - 8:j], s[j]
    p = unigram / unigram.sum()
    cands = rng.choice(vocab, size=(n, K), p=p).astype(np.int32)
    cands[:, 0] = truth
    return contexts, truth, cands, streams


def measure_queries(trie, contexts: np.ndarray, cands: np.ndarray, truth: np.ndarray) -> dict[str, dict]:
    b = len(contexts)
    cur = trie.cursors(contexts)
    few = [(contexts[i].tolist(), cands[i].tolist()) for i in range(256)]

    halves = [(contexts[: b // 2], cands[: b // 2]), (contexts[b // 2:], cands[b // 2:])]
    pool = ThreadPoolExecutor(2)

    def two_threads() -> None:  # queries release the GIL, so two threads run them in parallel
        for f in [pool.submit(trie.prob_batch, *h) for h in halves]:
            f.result()

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # GIL hand-offs at call boundaries, not after 5 ms convoys
    try:
        threaded = us(two_threads, b)
        threaded["cpu_median"] = None  # the calling thread only waits: CPU time says nothing here
    finally:
        sys.setswitchinterval(switch)
        pool.shutdown()
    return {
        "prob_batched_us_per_context": us(lambda: trie.prob_batch(contexts, cands), b),
        "prob_cursor_batched_us_per_context": us(lambda: trie.prob_cursors(cur, cands), b),
        "cursors_from_contexts_us_per_context": us(lambda: trie.cursors(contexts), b),
        "advance_batched_us_per_cursor": us(lambda: trie.advance(cur, truth), b),
        "topk25_batched_us_per_context": us(lambda: trie.topk_batch(contexts, K), b),
        "topk25_cursor_batched_us_per_context": us(lambda: trie.topk_cursors(cur, K), b),
        "prob_single_call_us": us(lambda: [trie.prob(c, k) for c, k in few], len(few)),
        "topk25_single_call_us": us(lambda: [trie.topk(c, K) for c, _ in few], len(few)),
        "prob_batched_2_threads_us_per_context": threaded,
    }


def measure_dict_trie(ref, contexts: np.ndarray, cands: np.ndarray) -> dict[str, dict]:
    few = [(contexts[i].tolist(), cands[i].tolist()) for i in range(256)]
    return {"prob_us_per_context": us(lambda: [[ref.prob(c, t) for t in k] for c, k in few], len(few), repeat=3),
            "topk25_us_per_context": us(lambda: [ref.topk(c, K) for c, _ in few[:64]], 64, repeat=3)}


def measure_load(path: Path) -> dict[str, Any]:
    from vllm_treespec.ngram import NgramTrie

    return {"file_bytes": path.stat().st_size, "load_us": us(lambda: NgramTrie.load(path), 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="site-packages sample of 24 MB instead of all of it")
    ap.add_argument("--site-packages-mb", type=float, default=None, help="cap the site-packages input (MB)")
    ap.add_argument("--order", type=int, default=3)
    ap.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    ap.add_argument("--memory-mb", type=float, default=1024)
    ap.add_argument("--queries", type=int, default=4096, help="contexts in the batched query set")
    ap.add_argument("--work-dir", default=None, help="where the trie files go (default: a temp dir, removed)")
    ap.add_argument("--reuse", action="store_true",
                    help="with --work-dir: keep tries (and their build records) from an earlier run there and "
                         "only re-measure loads and queries (e.g. once the shared machine is quiet)")
    ap.add_argument("--output", default=str(RESULTS))
    args = ap.parse_args(argv)

    from vllm_treespec.train import corpus
    from vllm_treespec.ngram import NgramTrie, build_trie
    from harness.dict_trie import DictTrie

    load_start = os.getloadavg()
    tok_dir, tok_name = tokenizer_dir()
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="bench-ngram-"))
    work.mkdir(parents=True, exist_ok=True)
    train, _ = corpus.split_files()
    sp_limit = 24.0 if args.quick and args.site_packages_mb is None else args.site_packages_mb
    inputs = {"stdlib": train, "site-packages": site_packages_files(sp_limit)}
    record = work / "builds.json"
    builds: dict[str, dict[str, Any]] = {}
    if args.reuse and args.work_dir and record.exists():
        builds = json.loads(record.read_text())
        print(f"[bench_ngram] reusing the tries and build records in {work}", file=sys.stderr, flush=True)
    for name, files in inputs.items():
        if name in builds and (work / f"{name}.trie").exists():
            continue
        print(f"[bench_ngram] building {name}: {len(files)} files, "
              f"{sum(p.stat().st_size for p in files) / 1e6:.1f} MB", file=sys.stderr, flush=True)
        rep = build_trie(files, work / f"{name}.trie", tok_dir, order=args.order, workers=args.workers,
                         memory_mb=args.memory_mb, progress=sys.stderr.isatty())
        builds[name] = {k: rep[k] for k in ("files", "input_bytes", "tokens", "num_nodes", "file_bytes",
                                            "bytes_per_node", "level_sizes", "seconds", "count_seconds",
                                            "merge_seconds", "tokens_per_second", "spill_runs", "workers")}
        builds[name]["loadavg_1_5_15_at_end"] = [round(x, 2) for x in os.getloadavg()]
        record.write_text(json.dumps(builds, indent=2))
    load_queries = os.getloadavg()

    load = {name: measure_load(work / f"{name}.trie") for name in inputs}
    trie = NgramTrie.load(work / "stdlib.trie")
    root_children = trie.topk([], trie.vocab_size)
    unigram = np.zeros(trie.vocab_size)
    for t, p in root_children:
        unigram[t] = p
    contexts, truth, cands, _ = query_set(tok_dir, args.queries, trie.vocab_size, unigram)
    queries = {"stdlib": measure_queries(trie, contexts, cands, truth)}
    big = NgramTrie.load(work / "site-packages.trie")
    queries["site-packages"] = measure_queries(big, contexts, cands, truth)

    print("[bench_ngram] building the pure-Python dict trie of the stdlib corpus", file=sys.stderr, flush=True)
    from vllm_treespec.ngram.tokenizer import encode_batch, load_tokenizer

    tok = load_tokenizer(tok_dir)
    t0 = time.perf_counter()
    ref = DictTrie.build(encode_batch(tok, [corpus.read_text(p) for p in train]), args.order)
    dict_build_s = time.perf_counter() - t0
    assert ref.num_nodes() == trie.num_nodes, "dict trie and C++ trie disagree"
    got = trie.prob_batch(contexts[:200], cands[:200])
    want = np.array([[ref.prob(c.tolist(), int(t)) for t in k] for c, k in zip(contexts[:200], cands[:200])])
    assert np.array_equal(got, want), "C++ and dict trie probabilities differ"
    dict_q = measure_dict_trie(ref, contexts, cands)
    del ref

    q = queries["stdlib"]
    loads = [v["load_us"]["median"] for v in load.values()]
    sizes = [v["file_bytes"] for v in load.values()]
    result = {
        "benchmark": "ngram",
        "hardware": {"cpu_model": cpu_model(), "cpu_cores": os.cpu_count(),
                     "loadavg_1_5_15_at_start": [round(x, 2) for x in load_start],
                     "loadavg_1_5_15_before_queries": [round(x, 2) for x in load_queries]},
        "software": {"python": platform.python_version(), "numpy": np.__version__, "commit": git_commit()},
        "settings": {"order": args.order, "workers": args.workers, "memory_mb": args.memory_mb, "k": K,
                     "queries": args.queries, "tokenizer": tok_name, "vocab_size": trie.vocab_size,
                     "site_packages_limit_mb": sp_limit,
                     "candidates": "true next token + 24 unigram-sampled tokens, held-out stdlib contexts"},
        "builds": builds,
        "load": load,
        "load_time_ratio_largest_to_smallest": max(loads) / min(loads),  # wall-clock medians
        "file_size_ratio_largest_to_smallest": max(sizes) / min(sizes),
        "queries_us": queries,
        "dict_trie_us": {**dict_q, "build_seconds": round(dict_build_s, 1)},
        "speedup_vs_dict": {
            "prob_batched": (dict_q["prob_us_per_context"]["cpu_median"]
                             / q["prob_batched_us_per_context"]["cpu_median"]),
            "topk25_batched": (dict_q["topk25_us_per_context"]["cpu_median"]
                               / q["topk25_batched_us_per_context"]["cpu_median"])},
        "bytes_per_node": max(b["bytes_per_node"] for b in builds.values()),
        # Thread CPU time per context (single-threaded batched prob over raw contexts, worse trie):
        # the cost on a core of its own; wall-clock medians and best rounds are kept next to it.
        "us_per_context_k25": max(v["prob_batched_us_per_context"]["cpu_median"] for v in queries.values()),
        "us_per_context_k25_wall_median": max(v["prob_batched_us_per_context"]["median"] for v in queries.values()),
        "us_per_context_k25_wall_best": max(v["prob_batched_us_per_context"]["best"] for v in queries.values()),
        "targets": {"bytes_per_node": 16.0, "us_per_context_k25": 1.0},
        "notes": ("us values are wall-clock {median, best} and thread-CPU median over rounds on a shared "
                  "2-core machine (other jobs ran; see loadavg); us_per_context_k25 is the CPU median. "
                  "Batched prob: candidates of one context search each child range in lockstep, the "
                  "lookups and back-off are branch-free (mispredicts on hit/miss were half the time), and "
                  "contexts run as a prefetch pipeline (TrieFile::prob_batch); see csrc/ngram/NOTES.md."),
    }
    result["meets_targets"] = {
        "bytes_per_node": result["bytes_per_node"] <= 16.0,
        "us_per_context_k25": result["us_per_context_k25"] <= 1.0,
        "load_time_independent_of_size": result["load_time_ratio_largest_to_smallest"] < 3.0,
    }

    rows = [("", "stdlib", "site-packages")]
    for key, fmt in [("tokens", "{:,}"), ("num_nodes", "{:,}"), ("file_bytes", "{:,}"), ("bytes_per_node", "{:.2f}"),
                     ("tokens_per_second", "{:,.0f}"), ("seconds", "{:.1f}")]:
        rows.append((f"build {key}", *(fmt.format(builds[n][key]) for n in inputs)))
    rows.append(("us: wall median / best / cpu median", "", ""))

    def cell(v: dict[str, Any], digits: int) -> str:
        cpu = "-" if v["cpu_median"] is None else f"{v['cpu_median']:.{digits}f}"
        return f"{v['median']:.{digits}f} / {v['best']:.{digits}f} / {cpu}"

    rows.append(("load us", *(cell(load[n]["load_us"], 1) for n in inputs)))
    for key in q:
        rows.append((key, *(cell(queries[n][key], 3) for n in inputs)))
    for key, v in dict_q.items():
        rows.append((f"dict trie {key}", cell(v, 1), "-"))
    w0 = max(len(r[0]) for r in rows)
    for r in rows:
        print(f"{r[0]:<{w0}}  {r[1]:>24}  {r[2]:>24}")
    out = Path(args.output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    if not args.work_dir:
        for name in inputs:
            (work / f"{name}.trie").unlink(missing_ok=True)
        record.unlink(missing_ok=True)
        work.rmdir()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
