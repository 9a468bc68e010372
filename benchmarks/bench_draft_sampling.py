"""Sampled vs top-k drafting for sampled requests (issue 7): the same draft model and tree shape,
with `drafter.draft_sampling: top_k` (the drafter's top-k children, target-only rule) and
`sample` (children drawn from the drafter's q, recursive rejection sampling), side by side in one
run at temperature > 0, with no speculation as the baseline.

Same harness as bench_serving.py (one OpenAI server per config, held-out code prompts, fixed
output length, --rounds medians). Outputs are samples, so they are not compared; losslessness of
both rules is what tests/test_e2e_draft_sampling.py and tests/test_e2e_tree_sampling.py check.

    .venv/bin/python benchmarks/bench_draft_sampling.py                   # temperature 1, budget 16
    .venv/bin/python benchmarks/bench_draft_sampling.py --temperature 0.7 --rounds 2

Rows: off; for each shape (draft chain D=6, DynaTree B=2 D=8 tau=0.005 as in
configs/drafters/draft-model.yaml, static template 3-2-2-1): top_k and sample.
"""
from __future__ import annotations

import treespec_fixtures  # noqa: F401  (fixture: paths and demo/ presets, here and in servers)
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_serving import parse_args as serving_args  # noqa: E402
from bench_serving import run_and_record  # noqa: E402

SHAPES = {
    "chain D=6": {"builder": "chain", "max_depth": 6},
    "dynatree B=2 D=8": {"builder": "threshold", "branch": 2, "max_depth": 8, "tau": 0.005},
    "static 3221": {"builder": "static", "template": [3, 2, 2, 1]},
}


def parse_args(argv: list[str] | None):
    import argparse

    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--draft", default="fixture:draft-lm", help="draft model (dir or fixture:NAME)")
    p.add_argument("--budget", type=int, default=16, help="node budget (num_speculative_tokens)")
    mine, rest = p.parse_known_args(argv)
    if "--temperature" not in rest:
        rest = ["--temperature", "1.0", *rest]
    if "--concurrency" not in rest:
        rest = ["--concurrency", "1", *rest]
    ns = serving_args(rest)
    for k, v in vars(mine).items():
        setattr(ns, k, v)
    if ns.temperature <= 0:
        raise SystemExit("bench_draft_sampling: --temperature must be > 0 (greedy requests always "
                         "get top-k trees)")
    return ns


def configs_for(ns) -> list:
    from harness.comparison import no_spec, treespec

    out = [no_spec()]
    for label, tree in SHAPES.items():
        for mode in ("top_k", "sample"):
            drafter = {"type": "draft_model", "path": ns.draft, "draft_sampling": mode}
            out.append(treespec(ns.budget, {"drafter": drafter, "tree": tree}, label=f"{label} {mode}"))
    return out


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    configs = configs_for(ns)
    return run_and_record(ns, "bench_draft_sampling", configs, ["off"],
                          extra={"draft": ns.draft, "budget": ns.budget},
                          note=f"temperature {ns.temperature}; vs off = tokens/s ratio at the same "
                               "concurrency; tau = tokens per verification step")


if __name__ == "__main__":
    sys.exit(main())
