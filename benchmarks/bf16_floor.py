"""The bf16 equality floor: how often plain vLLM's own greedy answers change with the batch.

No speculative method can be held to more greedy equality in bf16 than vLLM keeps with itself.
One server without speculation answers the same chat prompts at 1 client and again at each of
--concurrency; a different batch shape changes the bf16 rounding of the same logits, and where
the top two are within it the argmax flips and the answer goes its own way. Every difference is
explained as the regime matrix explains its own (bench_matrix.explain_mismatch: the top-2
logprob gap at the first differing token). With --dtype float32 the same run shows the floor
gone.

    .venv/bin/python benchmarks/bf16_floor.py                   # smollm2-135m, 32 prompts, 1 vs 8 and 32 clients
    .venv/bin/python benchmarks/bf16_floor.py --dtype float32 --output /tmp/floor_fp32.json
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

import treespec_fixtures  # noqa: E402,F401


def main(argv: list[str] | None = None) -> int:
    from bench_matrix import explain_mismatch
    from chat_prompts import chat_pool, describe
    from harness.report import hardware_info, hardware_line, software_info
    from harness.serving import run_load, serve
    from treespec_fixtures import build_fixture

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixture", default="smollm2-135m")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, nargs="+", default=[8, 32], help="compared with 1 client")
    p.add_argument("--dtype", default=None, help="serve in this dtype (default: the model's, bf16)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", type=Path, default=None)
    ns = p.parse_args(argv)

    model = build_fixture(ns.fixture)
    pool = chat_pool(ns.seed)
    prompts = pool[:ns.num_prompts]
    args = ["--enforce-eager", "--max-model-len", "2048"] + (["--dtype", ns.dtype] if ns.dtype else [])
    hw = hardware_info()
    print(hardware_line(hw), file=sys.stderr)
    t0 = time.time()
    with serve(model, (), base_args=args) as s:
        run_load(s, pool[-2:], max_tokens=8)
        ref = run_load(s, prompts, max_tokens=ns.max_tokens, concurrency=1, ignore_eos=False)
        rows = []
        for c in ns.concurrency:
            load = run_load(s, prompts, max_tokens=ns.max_tokens, concurrency=c, ignore_eos=False)
            mismatches = [{"prompt": prompts[i].id,
                           **explain_mismatch(s, None, a.token_ids, b.token_ids, a.prompt_token_ids)}
                          for i, (a, b) in enumerate(zip(ref.requests, load.requests)) if a.token_ids != b.token_ids]
            gaps = [m["top2_gap"] for m in mismatches if m.get("top2_gap") is not None]
            rows.append({"concurrency": c, "equal": [len(prompts) - len(mismatches), len(prompts)],
                         "top2_gap_median": statistics.median(gaps) if gaps else None,
                         "top2_gap_max": max(gaps) if gaps else None, "mismatches": mismatches})
            print(f"1 vs {c} clients: {len(prompts) - len(mismatches)}/{len(prompts)} answers equal"
                  + (f"; top-2 gap at the first difference: median {statistics.median(gaps):.4f}, "
                     f"max {max(gaps):.4f} nats" if gaps else ""))
    record = {"benchmark": "bf16_floor", "started_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "wall_s": round(time.time() - t0, 1), "hardware": hw, "software": software_info(),
              "model": {"fixture": ns.fixture, "dir_name": model.name}, "serve_args": args,
              "settings": {"num_prompts": ns.num_prompts, "max_tokens": ns.max_tokens, "ignore_eos": False,
                           "dtype": ns.dtype or "model default"},
              "prompts": {**describe(pool, ns.seed), "ids": [x.id for x in prompts]}, "rows": rows}
    out = ns.output or _HERE / "results" / f"bf16_floor_{ns.fixture}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
