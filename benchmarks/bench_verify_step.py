"""Per-step CPU overhead of tree verification outside the model forward: drafting prompt-lookup
trees, planning the step (positions, masks, logits rows) and greedy acceptance (argmax + walk),
at several batch sizes and budgets. Synthetic token buffers; vocab 4096 (the code-LM fixture's).

    .venv/bin/python benchmarks/bench_verify_step.py            # prints a table, last line JSON
    .venv/bin/python benchmarks/bench_verify_step.py --out benchmarks/results/bench_verify_step.json
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch


def measure(batch: int, budget: int, vocab: int, repeats: int) -> dict:
    import vllm._custom_ops  # noqa: F401  (registers vLLM's CPU greedy_argmax used by the walk)
    from vllm import SamplingParams

    from vllm_treespec.drafters.lookup_tree import lookup_trees
    from vllm_treespec.engine.tree_step import plan_tree_step
    from vllm_treespec.engine.tree_verifier import accepted_moves, verify_step

    rng = np.random.default_rng(0)
    buf = rng.integers(0, 64, size=(batch, 1200)).astype(np.int32)   # repetitive: many matches
    lens, rows = np.full(batch, 1000), np.arange(batch)
    budgets = np.full(batch, budget)
    ids = [f"r{i}" for i in range(batch)]
    params = [SamplingParams(temperature=0.0)] * batch

    def draft():
        return lookup_trees(buf, rows, lens, budgets, min_ngram=1, max_ngram=4, max_matches=8,
                            max_depth=1 << 20)

    trees = dict(zip(ids, draft()))
    drafts = {r: t.draft_token_ids() for r, t in trees.items()}
    nsched = np.array([len(drafts[r]) + 1 for r in ids])
    qsl = np.concatenate([[0], np.cumsum(nsched)])
    logits = torch.randn(int(nsched.sum()), vocab)

    def plan():
        return plan_tree_step(ids, nsched, drafts, trees, qsl, lens)

    step = plan()
    step.slot_mapping = torch.arange(int(nsched.sum()))

    def verify():
        _, res = verify_step(step, logits, params, [None] * batch, include=None, base=None)
        accepted_moves(step, res.accepted_nodes[torch.from_numpy(step.req_indices)])

    out = {"batch": batch, "budget": budget, "nodes": int(nsched.sum() - batch)}
    for name, fn in (("draft_ms", draft), ("plan_ms", plan), ("verify_ms", verify)):
        for _ in range(5):
            fn()
        times = []
        for _ in range(repeats):
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
        out[name] = 1e3 * float(np.median(times))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8, 32])
    p.add_argument("--budgets", type=int, nargs="+", default=[16, 64])
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--repeats", type=int, default=50)
    p.add_argument("--out", type=Path, default=None)
    ns = p.parse_args(argv)
    torch.set_num_threads(1)
    from harness.report import hardware_info, software_info

    rows = [measure(b, k, ns.vocab, ns.repeats) for b in ns.batches for k in ns.budgets]
    print(f"{'batch':>5} {'budget':>6} {'nodes':>6} {'draft ms':>9} {'plan ms':>8} {'verify ms':>9}")
    for r in rows:
        print(f"{r['batch']:>5} {r['budget']:>6} {r['nodes']:>6} {r['draft_ms']:>9.3f} "
              f"{r['plan_ms']:>8.3f} {r['verify_ms']:>9.3f}")
    record = {"benchmark": "bench_verify_step", "hardware": hardware_info(), "software": software_info(),
              "settings": {"vocab": ns.vocab, "repeats": ns.repeats, "threads": 1,
                           "drafter": "prompt lookup trees, max_matches 8", "mode": "greedy"},
              "rows": rows}
    if ns.out:
        ns.out.write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record))
    return 0


if __name__ == "__main__":
    sys.exit(main())
