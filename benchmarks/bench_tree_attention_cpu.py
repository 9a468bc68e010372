"""CPU tree attention per step, as the engine runs it: `plan_tree_attention` once per step, then
`apply_tree_attention` per layer, at the code-LM fixture's head shape (Hq 6, Hkv 3, D 64,
block 128, float32, vec layout) on binary trees, vs calling `tree_attention` (plan + apply) in
every layer as before the per-step plan.

    .venv/bin/python benchmarks/bench_tree_attention_cpu.py            # table + JSON record
    .venv/bin/python benchmarks/bench_tree_attention_cpu.py --out /tmp/x.json

Best of 5 repeats of 100 calls (this VM's speed drifts); torch threads as configured. Numbers
are per layer call; "3 layers" is the code-LM step (plan + 3 x apply).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

CASES = [(1, 8, 300), (1, 16, 300), (1, 64, 600), (8, 16, 300), (32, 16, 300)]   # (requests, rows, prefix)


def best_ms(fn, repeats: int = 5, calls: int = 100) -> float:
    for _ in range(5):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - start) / calls)
    return 1e3 * best


def binary_tree_words(n: int) -> torch.Tensor:
    """Ancestor-or-self words of the n-node binary tree (parent of i is (i - 1) // 2)."""
    anc = torch.zeros(n, -(-n // 64), dtype=torch.int64)
    for i in range(n):
        j = i
        while j >= 0:
            anc[i, j >> 6] |= (1 << (j & 63)) if (j & 63) < 63 else -(1 << 63)
            j = (j - 1) // 2 if j > 0 else -1
    return anc


def measure(b: int, n: int, prefix: int) -> dict:
    from harness.paged_cache import random_block_table, split_kv
    from vllm_treespec.attention.tree_attention_cpu import (apply_tree_attention, plan_tree_attention,
                                                            tree_attention)

    hq, hkv, d, bs = 6, 3, 64, 128
    need = -(-(prefix + n) // bs)
    nb = need * b + 4
    gen = torch.Generator().manual_seed(0)
    kc, vc = split_kv(torch.randn(nb, hkv, bs, 2 * d, generator=gen))
    table = random_block_table(gen, [need] * b, nb, need + 1)
    anc = binary_tree_words(n).repeat(b, 1)
    q = torch.randn(b * n, hq, d, generator=gen)
    offsets, pl = torch.arange(b + 1) * n, torch.full((b,), prefix)
    args = dict(num_rows=b * n, num_q_heads=hq, num_kv_heads=hkv, head_size=d, num_blocks=nb, block_size=bs)
    plan_ms = best_ms(lambda: plan_tree_attention(table, pl, offsets, anc, **args))
    plan = plan_tree_attention(table, pl, offsets, anc, **args)
    apply_ms = best_ms(lambda: apply_tree_attention(plan, q, kc, vc, 0.125, layout="vec"))
    full_ms = best_ms(lambda: tree_attention(q, kc, vc, table, pl, offsets, anc, 0.125, layout="vec"))
    return {"requests": b, "rows": n, "prefix": prefix, "plan_ms": plan_ms, "apply_ms": apply_ms,
            "planned_3_layers_ms": plan_ms + 3 * apply_ms, "unplanned_call_ms": full_ms,
            "unplanned_3_layers_ms": 3 * full_ms}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path,
                   default=Path(__file__).resolve().parent / "results" / "bench_tree_attention_cpu.json")
    ns = p.parse_args(argv)
    from harness.report import git_commit, hardware_info, hardware_line, software_info

    print(hardware_line(hardware_info()), f"| torch threads {torch.get_num_threads()}")
    print(f"{'reqs':>4} {'rows':>4} {'prefix':>6} {'plan ms':>8} {'apply ms':>9} {'step (3 layers)':>16} "
          f"{'unplanned step':>15}")
    rows = []
    for case in CASES:
        r = measure(*case)
        rows.append(r)
        print(f"{r['requests']:4d} {r['rows']:4d} {r['prefix']:6d} {r['plan_ms']:8.3f} {r['apply_ms']:9.3f} "
              f"{r['planned_3_layers_ms']:16.3f} {r['unplanned_3_layers_ms']:15.3f}", flush=True)
    ns.out.write_text(json.dumps({"benchmark": "bench_tree_attention_cpu", "hardware": hardware_info(),
                                  "software": software_info(), "commit": git_commit(),
                                  "torch_threads": torch.get_num_threads(), "rows": rows}, indent=1))
    print(f"wrote {ns.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
