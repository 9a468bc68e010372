"""A draft head's serving forward, alone: `extend` (append a step's committed rows to a request's
context cache) and `draft` (one block forward giving d per-depth log-probs), per head shape and
`drafter.dtype`, at the code-LM fixture's sizes (hidden 384, vocabulary 4096, 500 context rows).

Timing does not depend on the weights' values, so shapes the fixtures do not ship (one layer,
narrower MLP) use random weights. Best of 5 repeats of 50 calls, one torch thread (the engine's
worker on this VM runs one). Numbers are per step: extend of 4 rows (a typical accepted path)
plus draft, at 1 and 8 requests.

    .venv/bin/python benchmarks/bench_head_forward.py                    # table + JSON record
    .venv/bin/python benchmarks/bench_head_forward.py --dtypes float32 --output /tmp/x.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_tree_attention_cpu import best_ms  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
BASE = dict(hidden_size=384, vocab_size=4096, target_num_layers=3, feature_layers=(0, 1), depth=8,
            num_heads=6, num_kv_heads=3, head_dim=64)
# (name, kind, shape overrides): the fixture heads' shapes, then cheaper ones
SHAPES = [("dart (fixture shape)", "dart", {"intermediate_size": 1152}),
          ("jetspec 2 layers (fixture shape)", "jetspec", {"intermediate_size": 1152, "num_layers": 2}),
          ("jetspec 1 layer", "jetspec", {"intermediate_size": 1152, "num_layers": 1}),
          ("jetspec 1 layer, MLP 384", "jetspec", {"intermediate_size": 384, "num_layers": 1})]


def make_head(kind: str, overrides: dict, dtype: torch.dtype):
    from vllm_treespec.drafters.heads.dart import DartConfig, DartHead
    from vllm_treespec.drafters.heads.jetspec import JetSpecConfig, JetSpecHead

    torch.manual_seed(0)
    embed = torch.nn.Embedding(BASE["vocab_size"], BASE["hidden_size"])
    config_cls, head_cls = (DartConfig, DartHead) if kind == "dart" else (JetSpecConfig, JetSpecHead)
    return head_cls(config_cls(**BASE, **overrides), embed).eval().requires_grad_(False).to(dtype)


def time_head(head, requests: int, context: int, committed: int) -> dict:
    """ms of one step: extend every request by `committed` rows, then one batched draft."""
    feats_dim = len(head.config.feature_layers) * head.config.hidden_size
    dtype = head.fc.weight.dtype
    g = torch.Generator().manual_seed(1)
    with torch.inference_mode():
        caches = [head.extend(head.new_cache(), torch.randn(context, feats_dim, generator=g).to(dtype),
                              torch.randint(0, head.config.vocab_size, (context,), generator=g))
                  for _ in range(requests)]
        rows = torch.randn(committed, feats_dim, generator=g).to(dtype)
        nxt = torch.randint(0, head.config.vocab_size, (committed,), generator=g)
        extend = best_ms(lambda: [head.extend(c, rows, nxt) for c in caches], calls=50)
        draft = best_ms(lambda: head.draft(caches), calls=50)
    return {"extend_ms": round(extend, 3), "draft_ms": round(draft, 3), "step_ms": round(extend + draft, 3)}


def main(argv: list[str] | None = None) -> int:
    from harness.report import hardware_info, hardware_line, software_info

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16", "float16"])
    p.add_argument("--requests", type=int, nargs="+", default=[1, 8])
    p.add_argument("--context", type=int, default=500, help="context rows per request")
    p.add_argument("--committed", type=int, default=4, help="rows each request commits per step")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--output", type=Path, default=RESULTS / "bench_head_forward_code-lm.json")
    ns = p.parse_args(argv)
    torch.set_num_threads(ns.threads)
    rows = []
    print(f"{'head':34s} {'dtype':9s} {'reqs':>4s} {'extend':>7s} {'draft':>7s} {'step ms':>8s} {'weights MB':>10s}")
    for name, kind, overrides in SHAPES:
        for dtype_name in ns.dtypes:
            head = make_head(kind, overrides, getattr(torch, dtype_name))
            mb = sum(t.numel() * t.element_size() for t in head.trainable_state().values()) / 2**20
            for r in ns.requests:
                row = {"head": name, "kind": kind, "shape": overrides, "dtype": dtype_name, "requests": r,
                       "weights_mb": round(mb, 2), **time_head(head, r, ns.context, ns.committed)}
                rows.append(row)
                print(f"{name:34s} {dtype_name:9s} {r:4d} {row['extend_ms']:7.3f} {row['draft_ms']:7.3f} "
                      f"{row['step_ms']:8.3f} {mb:10.2f}", flush=True)
    hw = hardware_info()
    record = {"benchmark": "bench_head_forward", "hardware": hw, "software": software_info(),
              "torch_threads": ns.threads, "context_rows": ns.context, "committed_rows": ns.committed,
              "base_shape": {k: list(v) if isinstance(v, tuple) else v for k, v in BASE.items()}, "rows": rows,
              "command": "benchmarks/bench_head_forward.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    ns.output.parent.mkdir(parents=True, exist_ok=True)
    ns.output.write_text(json.dumps(record, indent=2) + "\n")
    print(ns.output, "|", hardware_line(hw))
    return 0


if __name__ == "__main__":
    sys.exit(main())
