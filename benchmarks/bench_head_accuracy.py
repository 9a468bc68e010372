"""Held-out per-depth accuracy of learned draft heads trained side by side on the same data
(issue 8): DART shifted vs unshifted logits (DART Table 3 analogue), DART's annealing gamma sweep
(Table 4 analogue), and the JetSpec causal head vs its diffusion-style (bidirectional) twin.

Every variant trains from the same seed on the `head-data` fixture (code-lm's own continuations of
256 training prompts, regenerated through vLLM) with the fixture heads' recipes and only the named
change, and is evaluated on the same held-out tenth of the sequences, twice: on 64-row windows
(short contexts, as the DART fixture trains) and on whole sequences (<= 512 rows, the long
contexts serving hands a head). alpha-k = the head's top-1 at depth k equals the target's greedy
token, hit@10 = the target's token is in the head's top 10.

    .venv/bin/python benchmarks/bench_head_accuracy.py                   # everything, fixture steps
    .venv/bin/python benchmarks/bench_head_accuracy.py --variants dart dart-unshifted --steps 200
"""
from __future__ import annotations

import treespec_fixtures  # noqa: F401  (fixture: paths and demo/ presets, here and in servers)
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
    out["dart-window-256"] = ("dart", {}, {"window": 256, "batch_size": 4})   # longer training contexts
    out["jetspec-causal"] = ("jetspec", {"num_layers": 2}, {})
    out["jetspec-bidirectional"] = ("jetspec", {"num_layers": 2, "within_block": "bidirectional"}, {})
    # a cheaper head: one layer and a third of the MLP width (serving cost, drafters/heads/NOTES.md)
    out["jetspec-narrow"] = ("jetspec", {"num_layers": 1, "intermediate_size": 384}, {})
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", nargs="+", default=list(variants()), choices=list(variants()))
    p.add_argument("--steps", type=int, default=None,
                   help="training steps per variant (default: the fixture recipe's, DART 600, JetSpec 400)")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--output", type=Path, default=RESULTS / "bench_head_accuracy_code-lm.json")
    return p.parse_args(argv)


def train_variant(name: str, steps: int | None, work: Path) -> dict:
    from treespec_fixtures import build_fixture
    from treespec_fixtures.heads import DART_HEAD_RECIPE, JETSPEC_HEAD_RECIPE
    from vllm_treespec.train.cli import train_head

    kind, shape, changes = variants()[name]
    recipe_dict = dict((DART_HEAD_RECIPE if kind == "dart" else JETSPEC_HEAD_RECIPE)["train"])
    recipe_dict.update(steps=steps or recipe_dict["steps"], **changes)
    if kind == "dart":
        from vllm_treespec.train.dart_recipe import DartRecipe as Recipe
    else:
        from vllm_treespec.train.jetspec_recipe import JetSpecRecipe as Recipe
    recipe = Recipe(**recipe_dict)
    start = time.perf_counter()
    target = build_fixture("code-lm")
    train_head(target, build_fixture("head-data"), work / name, recipe, kind=kind, depth=8, resume=False,
               progress=False, **shape)
    train_s = round(time.perf_counter() - start, 1)
    return {"variant": name, "kind": kind, "config": shape, "recipe": recipe_dict, "train_s": train_s,
            **evaluate_windows(target, work / name)}


def evaluate_windows(target_dir: Path, head_dir: Path) -> dict:
    """Held-out metrics of a checkpoint on 64-row windows (keys accuracy, hit_at_10) and on whole
    sequences (keys accuracy_full, hit_at_10_full)."""
    import json as _json

    import torch
    from transformers import AutoModelForCausalLM

    from vllm_treespec.drafters.heads.checkpoint import load_head
    from vllm_treespec.drafters.parallel_head import target_embedding
    from treespec_fixtures import build_fixture
    from vllm_treespec.train.cli import held_out_mask
    from vllm_treespec.train.loop import evaluate_head
    from vllm_treespec.train.shards import SequenceWindows, load_shards

    model = AutoModelForCausalLM.from_pretrained(str(target_dir), dtype=torch.float32)
    head = load_head(head_dir, model.config, target_embedding(model))
    data_dir = build_fixture("head-data")
    manifest = _json.loads((data_dir / "data.json").read_text())
    data = load_shards([data_dir / s for s in manifest["shards"]])
    held = data.subset(held_out_mask(data.num_sequences))
    short = evaluate_head(head, SequenceWindows(held, 64))
    full = evaluate_head(head, SequenceWindows(held, 512), batch_size=2)
    return {**short, "accuracy_full": full["accuracy"], "hit_at_10_full": full["hit_at_10"]}


def plot(rows: list[dict], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    for row in rows:
        depth = range(1, len(row["accuracy"]) + 1)
        axes[0].plot(depth, row["accuracy"], marker="o", label=row["variant"])
        axes[1].plot(depth, row["accuracy_full"], marker="o", label=row["variant"])
        axes[2].plot(depth, row["hit_at_10_full"], marker="o", label=row["variant"])
    for ax, what in zip(axes, ("alpha-k, 64-row windows", "alpha-k, whole sequences",
                               "hit@10, whole sequences")):
        ax.set_xlabel("depth k")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
    axes[2].legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    from harness.report import hardware_info, hardware_line, software_info

    ns = parse_args(argv)
    if ns.threads:
        import torch

        torch.set_num_threads(ns.threads)
    hw, sw = hardware_info(), software_info()        # the code that trains, before it runs
    command = "benchmarks/bench_head_accuracy.py " + " ".join(argv if argv is not None else sys.argv[1:])
    ns.output.parent.mkdir(parents=True, exist_ok=True)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in ns.variants:
            row = train_variant(name, ns.steps, Path(tmp))
            rows.append(row)
            acc = " ".join(f"{a:.3f}" for a in row["accuracy"])
            full = " ".join(f"{a:.3f}" for a in row["accuracy_full"])
            print(f"{name:24s} train {row['train_s']:7.1f}s  alpha-k (64 rows) {acc}  (whole) {full}", flush=True)
            # written after every variant: an hour-long run that stops early keeps what it measured
            record = {"benchmark": "bench_head_accuracy", "hardware": hw, "software": sw,
                      "data": "fixture:head-data (code-lm)", "steps": ns.steps, "rows": rows,
                      "complete": len(rows) == len(ns.variants), "command": command}
            ns.output.write_text(json.dumps(record, indent=2) + "\n")
    print(ns.output)
    print(plot(rows, ns.output.with_suffix(".png"),
               f"held-out per-depth accuracy, code-lm heads, {ns.steps or 'fixture'} steps, {hardware_line(hw)}"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
