"""Serving benchmark for learned draft heads (issue 8): the code-LM fixture's DART, JetSpec and
diffusion-style heads with their tree builders, side by side with no speculation, vLLM's `ngram`
and the best treespec drafters without a head (lookup-trie trees, the draft model), in one run.

Same harness as bench_serving.py (one OpenAI server per config, held-out code prompts, greedy,
fixed output length, --rounds medians; outputs must equal no speculation).

    .venv/bin/python benchmarks/bench_heads.py --rounds 2
    .venv/bin/python benchmarks/bench_heads.py --budgets 16 32 --no-draft-model
    .venv/bin/python benchmarks/bench_heads.py --rounds 2 --head-dtypes auto bfloat16   # side by side

Rows: off; vLLM ngram at each --ngram-k; lookup-trie tree (8 nodes, the best treespec config at
one client in bench_serving_lookup_trie_code-lm.json); draft-model DynaTree preset; at each
--budgets value: DART head chain, best-first and DART beam + n-gram rho (the `dart` preset's
tree); JetSpec head chain and best-first (the `jetspec` preset's tree); the diffusion-style head
with PRESTO beam + n-gram rho (the `diffusion-presto` preset's tree).
"""
from __future__ import annotations

import treespec_fixtures  # noqa: F401  (fixture: paths and demo/ presets, here and in servers)
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serving import parse_args as serving_args  # noqa: E402
from bench_serving import run_and_record  # noqa: E402


def parse_args(argv: list[str] | None):
    import argparse

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--head", default="fixture:dart-head", help="DART head checkpoint (dir or fixture:NAME)")
    p.add_argument("--jetspec-head", default="fixture:jetspec-head", help="JetSpec head checkpoint")
    p.add_argument("--diffusion-head", default="fixture:diffusion-head", help="diffusion-style head checkpoint")
    p.add_argument("--no-jetspec", action="store_true", help="skip the JetSpec and diffusion rows")
    p.add_argument("--no-draft-model", action="store_true", help="skip the draft-model row")
    p.add_argument("--head-dtypes", nargs="+", default=["auto"], choices=["auto", "float32", "bfloat16", "float16"],
                   help="drafter.dtype of every head row; several = each head row once per dtype")
    mine, rest = p.parse_known_args(argv)
    rest = ["--budgets", "16", *rest] if "--budgets" not in rest else rest
    rest = ["--ngram-k", "8", "16", *rest] if "--ngram-k" not in rest else rest
    ns = serving_args(rest)
    for k, v in vars(mine).items():
        setattr(ns, k, v)
    return ns


def configs_for(ns) -> tuple[list, list[str]]:
    from harness.comparison import no_spec, treespec, vllm_ngram

    ngram = [vllm_ngram(k) for k in ns.ngram_k]
    out = [no_spec(), *ngram, treespec(8, "demo/lookup-trie-tree")]
    if not ns.no_draft_model:
        out.append(treespec(16, "demo/draft-model"))
    for dtype in ns.head_dtypes:
        out += _head_rows(ns, dtype)
    return out, [c.name for c in ngram]


def _head_rows(ns, dtype: str) -> list:
    from harness.comparison import treespec

    tag = "" if dtype == "auto" else f" {dtype}"
    out = []
    head = {"type": "dart", "path": ns.head, "dtype": dtype}
    for b in ns.budgets:
        out += [treespec(min(b, 8), {"drafter": head, "tree": {"builder": "chain"}}, label="dart chain" + tag),
                treespec(b, {"drafter": head, "tree": {"builder": "best_first", "topk": 8}},
                         label="dart best-first" + tag),
                treespec(b, {"drafter": {**head, "ngram": "fixture:stdlib-3gram"},
                             "tree": {"builder": "beam", "topk": 8, "width": 8, "scorer": "dart"}},
                         label="dart beam+ngram" + tag)]
        if ns.no_jetspec:
            continue
        js = {"type": "jetspec", "path": ns.jetspec_head, "topk": 8, "dtype": dtype}
        diff = {"type": "jetspec", "path": ns.diffusion_head, "topk": 8, "ngram": "fixture:stdlib-3gram",
                "dtype": dtype}
        out += [treespec(min(b, 8), {"drafter": js, "tree": {"builder": "chain"}}, label="jetspec chain" + tag),
                treespec(b, {"drafter": js, "tree": {"builder": "best_first", "topk": 8}},
                         label="jetspec best-first" + tag),
                treespec(b, {"drafter": diff, "tree": {"builder": "beam", "topk": 8, "width": 8,
                                                       "scorer": "presto"}}, label="diffusion presto" + tag)]
    return out


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    configs, refs = configs_for(ns)
    return run_and_record(ns, "bench_heads", configs, refs,
                          extra={"head": ns.head, "jetspec_head": ns.jetspec_head,
                                 "diffusion_head": ns.diffusion_head, "budgets": ns.budgets, "ngram_k": ns.ngram_k,
                                 "head_dtypes": ns.head_dtypes},
                          note="vs off / vs ref = tokens/s ratios at the same concurrency; "
                               "draft ms = head forward + tree builder per step")


if __name__ == "__main__":
    sys.exit(main())
