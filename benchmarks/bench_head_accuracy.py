"""Held-out per-depth accuracy of learned draft heads trained side by side on the same data
(issue 8): DART shifted vs unshifted logits (DART Table 3 analogue), DART's annealing gamma sweep
(Table 4 analogue), and the JetSpec causal head vs its diffusion-style (bidirectional) twin.

Every variant trains from the same seed on the `head-data` fixture (code-lm's own continuations of
256 training prompts, regenerated through vLLM) with the fixture heads' recipes and only the named
change, and is evaluated on the same held-out tenth of the sequences: alpha-k = the head's top-1
at depth k equals the target's greedy token, hit@10 = the target's token is in the head's top 10.

    .venv/bin/python benchmarks/bench_head_accuracy.py                   # everything, 600 steps each
    .venv/bin/python benchmarks/bench_head_accuracy.py --variants dart dart-unshifted --steps 200
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def variants() -> dict[str, tuple[str, dict, dict]]:
    """name -> (head kind, config overrides, recipe overrides)."""
    out: dict[str, tuple[str, dict, dict]] = {
        "dart": ("dart", {}, {}),
        "dart-unshifted": ("dart", {"shifted": False}, {}),
    }
    for g in (0.5, 0.7, 0.8, 0.9, 1.0):
        out[f"dart-gamma-{g}"] = ("dart", {}, {"gamma": g})
    out["jetspec-causal"] = ("jetspec", {"num_layers": 2}, {})
    out["jetspec-bidirectional"] = ("jetspec", {"num_layers": 2, "within_block": "bidirectional"}, {})
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=list(variants()), choices=list(variants()))
    p.add_argument("--steps", type=int, default=600, help="training steps per variant (fixtures: 600)")
    p.add_argument("--output", type=Path, default=RESULTS / "bench_head_accuracy_code-lm.json")
    return p.parse_args(argv)


def train_variant(name: str, steps: int, work: Path) -> dict:
    from vllm_treespec.fixtures import build_fixture
    from vllm_treespec.fixtures.heads import DART_HEAD_RECIPE, JETSPEC_HEAD_RECIPE
    from vllm_treespec.train.cli import train_head

    kind, shape, changes = variants()[name]
    recipe_dict = dict((DART_HEAD_RECIPE if kind == "dart" else JETSPEC_HEAD_RECIPE)["train"])
    recipe_dict.update(steps=steps, **changes)
    if kind == "dart":
        from vllm_treespec.train.dart_recipe import DartRecipe as Recipe
    else:
        from vllm_treespec.train.jetspec_recipe import JetSpecRecipe as Recipe
    recipe = Recipe(**recipe_dict)
    start = time.perf_counter()
    metrics = train_head(build_fixture("code-lm"), build_fixture("head-data"), work / name, recipe, kind=kind,
                         depth=8, resume=False, progress=False, **shape)
    return {"variant": name, "kind": kind, "config": shape, "recipe": recipe_dict,
            "train_s": round(time.perf_counter() - start, 1), **metrics}


def plot(rows: list[dict], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for row in rows:
        depth = range(1, len(row["accuracy"]) + 1)
        axes[0].plot(depth, row["accuracy"], marker="o", label=row["variant"])
        axes[1].plot(depth, row["hit_at_10"], marker="o", label=row["variant"])
    for ax, what in zip(axes, ("alpha-k (top-1 accuracy)", "hit@10")):
        ax.set_xlabel("depth k")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    from vllm_treespec.report import hardware_info, hardware_line, software_info

    ns = parse_args(argv)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ns.variants:
            row = train_variant(name, ns.steps, Path(tmp))
            rows.append(row)
            acc = " ".join(f"{a:.3f}" for a in row["accuracy"])
            hit = " ".join(f"{a:.3f}" for a in row["hit_at_10"])
            print(f"{name:24s} train {row['train_s']:7.1f}s  alpha-k {acc}  hit@10 {hit}", flush=True)
    hw = hardware_info()
    record = {"benchmark": "bench_head_accuracy", "hardware": hw, "software": software_info(),
              "data": "fixture:head-data (code-lm)", "steps": ns.steps, "rows": rows,
              "command": "benchmarks/bench_head_accuracy.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    ns.output.parent.mkdir(parents=True, exist_ok=True)
    ns.output.write_text(json.dumps(record, indent=2) + "\n")
    print(ns.output)
    print(plot(rows, ns.output.with_suffix(".png"),
               f"held-out per-depth accuracy, code-lm heads, {ns.steps} steps, {hardware_line(hw)}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
