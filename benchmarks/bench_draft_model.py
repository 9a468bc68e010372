"""Serving benchmark for external draft models (issue 7): no speculation vs vLLM's built-in
`draft_model` method (linear, the same transformer draft) vs treespec draft-model chains,
DynaTree trees and Mamba template trees (fixed and bandit-chosen), side by side in one run.

Same harness as bench_serving.py (one OpenAI server per config, held-out code prompts, greedy,
fixed output length, --rounds medians); the reference is vLLM's draft_model at its fastest K.

    .venv/bin/python benchmarks/bench_draft_model.py                         # default sweep
    .venv/bin/python benchmarks/bench_draft_model.py --budgets 16 --rounds 1 --no-mamba

Rows: off; vllm-draft K (each --vllm-k); treespec draft chain (depth = each --chain-depth);
DynaTree D=6 B=3 tau=0.03 at every --budgets value and D=8 B=2 at the smallest; Mamba with each
fixed template of the paper and with the UCB bandit at the smallest budget.
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
    p.add_argument("--draft", default="fixture:draft-lm", help="transformer draft (dir or fixture:NAME)")
    p.add_argument("--mamba", default="fixture:mamba-draft-lm", help="Mamba draft (dir or fixture:NAME)")
    p.add_argument("--no-mamba", action="store_true")
    p.add_argument("--vllm-k", type=int, nargs="+", default=[2, 4, 6])
    p.add_argument("--chain-depth", type=int, nargs="+", default=[4, 6])
    mine, rest = p.parse_known_args(argv)
    rest = ["--budgets", "16", "32", "64", *rest] if "--budgets" not in rest else rest
    ns = serving_args(rest)
    for k, v in vars(mine).items():
        setattr(ns, k, v)
    return ns


def configs_for(ns) -> tuple[list, list[str]]:
    from harness.comparison import no_spec, treespec, vllm_draft_model
    from vllm_treespec.drafters.lm.loading import resolve_model_dir
    from vllm_treespec.tree.bandit import MAMBA_TEMPLATES

    draft = {"type": "draft_model", "path": ns.draft}
    vllm = [vllm_draft_model(k, resolve_model_dir(ns.draft)) for k in ns.vllm_k]
    out = [no_spec(), *vllm]
    out += [treespec(d, {"drafter": draft, "tree": {"builder": "chain", "max_depth": d}},
                     label=f"draft-chain D={d}") for d in ns.chain_depth]
    for b in ns.budgets:
        out.append(treespec(b, {"drafter": draft, "tree": {"builder": "threshold", "branch": 3,
                                                           "max_depth": 6, "tau": 0.03}},
                            label="dynatree D=6 B=3"))
    small = min(ns.budgets)
    out.append(treespec(small, {"drafter": draft, "tree": {"builder": "threshold", "branch": 2,
                                                           "max_depth": 8, "tau": 0.03}},
                        label="dynatree D=8 B=2"))
    if not ns.no_mamba:
        mamba = {"type": "draft_model", "path": ns.mamba}
        for t in MAMBA_TEMPLATES:
            out.append(treespec(small, {"drafter": mamba, "tree": {"builder": "static", "template": list(t)}},
                                label=f"mamba {''.join(map(str, t))}"))
        out.append(treespec(small, {"drafter": {**mamba, "templates": [list(t) for t in MAMBA_TEMPLATES]},
                                    "tree": {"builder": "static"}}, label="mamba bandit"))
    return out, [c.name for c in vllm]


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    configs, refs = configs_for(ns)
    return run_and_record(ns, "bench_draft_model", configs, refs,
                          extra={"draft": ns.draft, "mamba": None if ns.no_mamba else ns.mamba,
                                 "vllm_k": ns.vllm_k, "budgets": ns.budgets},
                          note="vs off / vs ref = tokens/s ratios at the same concurrency; "
                               "draft ms = drafter + builder per step")


if __name__ == "__main__":
    sys.exit(main())
