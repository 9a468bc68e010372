"""Projected GPU speedup of each drafter / preset: GPU forward costs (gpu_forward_costs.py, one
GPU run) combined with the acceptance each config reaches on the CPU code-LM fixture (the
committed replay records benchmarks/results/replay_tau_*.json).

Hardware assumption: the costs JSON comes from one accelerator (an H100 for the record) running
an 8B Llama-3-shaped target with random weights; acceptance does not depend on hardware, so the
CPU fixture's tau is reused, although the fixture target is a small code LM, not an 8B model.

Per replay row (file, config, budget) and batch size B (B requests, each drafting as the row did):

    step_ms   = f * T_B(1 + mean_nodes) + (1 - f) * T_B(1) + draft_B
    ms/token  = step_ms / tokens_per_step          (spec)       vs  T_B(1)   (no speculation)
    speedup   = T_B(1) * tokens_per_step / step_ms

T_B(n): the target's graph-captured forward over B requests with n query rows each (linear
interpolation between the measured n); f = drafted_steps / steps. When every step drafts
(f = 1), tokens_per_step = tau and this is (T_B(rows) + draft_B) / tau against T_B(1).
draft_B by drafter: DART / JetSpec / diffusion heads: the measured head step at B ("eager": as
drafters/parallel_head.py runs it; "graph": the same arithmetic graph-captured); draft LM:
calls x the measured one-row forward at B (calls = tree levels: ceil(mean_nodes) for chains,
max_depth for threshold trees, 1 + ceil(mean_nodes / 4) for best-first with its prefetch of 4;
a measured k-step chain graph replaces calls x forward when calls = k); CPU drafters (prompt
lookup, lookup / n-gram tries): B x the record's own draft_ms_per_step on the 2-core CPU
(serial). Mamba draft LMs have no GPU cost measured and are skipped, as are rows whose
drafter cannot be resolved.

Not modelled (stated in the output too): scheduler, sampling, tree acceptance and KV compaction
overheads, the tree builders' CPU time for heads and draft LMs, the draft LM's catch-up rows,
vLLM's padding of row counts to its graph sizes, and tree-masked attention kernels.

    python benchmarks/project_gpu_speedup.py --costs /tmp/costs --out /tmp/proj
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
PRESETS = ROOT / "configs"
CPU_DRAFTERS = ("prompt_lookup", "lookup_trie", "ngram_trie")
BEST_FIRST_PREFETCH = 4          # drafters/draft_model.py: nodes expanded per draft-LM call

NOTES = [
    "Projection, not a measurement: ignores scheduler, sampling, acceptance / KV-compaction and "
    "tree-builder CPU overheads, the draft LM's catch-up rows and vLLM's row padding to graph sizes.",
    "Target cost: graph-captured forward of a random-weight Llama-3-8B-shaped model with plain "
    "lower-right causal attention (a tree mask would only remove work).",
    "tau / tokens_per_step / mean_nodes come from the CPU code-LM fixture (a small target); an 8B "
    "target's acceptance may differ.",
    "CPU drafters' cost is the record's draft_ms_per_step on the 2-core CPU, times B (serial).",
]

__all__ = ["interpolate", "project_row", "project", "main"]


# -- costs ----------------------------------------------------------------------------------

def load_costs(path: Path) -> dict[str, Any]:
    """The gpu_forward_costs.json of a directory or file."""
    path = path / "gpu_forward_costs.json" if path.is_dir() else path
    return json.loads(path.read_text())


def interpolate(points: dict[int, float], x: float) -> float | None:
    """Linear interpolation of measured (rows -> ms); None beyond the largest measured rows."""
    xs = sorted(points)
    if not xs or x > xs[-1]:
        return None
    if x <= xs[0]:
        return points[xs[0]]
    for lo, hi in zip(xs, xs[1:]):
        if lo <= x <= hi:
            return points[lo] + (points[hi] - points[lo]) * (x - lo) / (hi - lo)
    return None


def target_curve(costs: dict[str, Any], batch: int) -> dict[int, float]:
    """rows -> graph ms of the target at this batch size (failed measurements left out)."""
    return {int(r["rows"]): float(r["graph_ms"]) for r in costs.get("target", {}).get("results", [])
            if r["batch"] == batch and isinstance(r.get("graph_ms"), (int, float))}


def _by_batch(results: list[dict[str, Any]], batch: int) -> dict[str, Any]:
    return next((r for r in results if r.get("batch") == batch), {})


# -- drafters -------------------------------------------------------------------------------

def _inline_configs() -> dict[str, Any]:
    """benchmarks/replay_tau.py's named inline configs (dart-chain, jetspec-best-first, ...)."""
    try:
        spec = importlib.util.spec_from_file_location("_replay_tau_inline", ROOT / "benchmarks" / "replay_tau.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return dict(module.INLINE)
    except Exception:                                   # noqa: BLE001 - presets still resolve
        return {}


def resolve_spec(row: dict[str, Any], inline: dict[str, Any]) -> tuple[dict[str, Any] | None, str]:
    """(treespec dict, where it came from) of a replay row: its inline dict, a replay_tau inline
    name, or a preset YAML under configs/ (drafters/NAME.yaml or NAME.yaml)."""
    spec = row.get("treespec")
    if isinstance(spec, dict):
        return spec, "row treespec"
    name = spec if isinstance(spec, str) else row.get("config", "")
    if name in inline:
        return inline[name], f"replay_tau.py INLINE[{name!r}]"
    for path in (PRESETS / "drafters" / f"{name}.yaml", PRESETS / f"{name}.yaml"):
        if path.is_file():
            import yaml

            return yaml.safe_load(path.read_text()) or {}, str(path.relative_to(ROOT))
    return None, f"no preset or inline config named {name!r}"


def drafter_kind(spec: dict[str, Any], name: str) -> str:
    """dart / jetspec / diffusion / draft_lm / mamba / a CPU drafter type / unknown."""
    d = spec.get("drafter") or {}
    kind, path = d.get("type", ""), str(d.get("path", ""))
    if kind == "jetspec":
        return "diffusion" if "diffusion" in path or "diffusion" in name else "jetspec"
    if kind == "draft_model":
        return "mamba" if "mamba" in path or "mamba" in name else "draft_lm"
    return kind or "unknown"


def tree_label(spec: dict[str, Any]) -> str:
    """Short tree description for tables (builder, max_depth, topk / branch), e.g. best_first d8 k4."""
    tree = spec.get("tree") or {}
    parts = [str(tree.get("builder", "?"))]
    parts += [f"{tag}{tree[key]}" for key, tag in (("max_depth", "d"), ("topk", "k"), ("branch", "b"), ("width", "w"))
              if tree.get(key) is not None]
    if (spec.get("drafter") or {}).get("ngram") or tree.get("scorer") in ("dart", "presto"):
        parts.append(f"+{tree.get('scorer', 'ngram')}")
    return " ".join(parts)


def draft_lm_calls(spec: dict[str, Any], mean_nodes: float) -> int:
    """Draft-LM calls per step = tree levels run (drafters/draft_model.py: one batched call per level)."""
    tree = spec.get("tree") or {}
    builder, depth = tree.get("builder", "chain"), tree.get("max_depth")
    if builder == "best_first":
        return 1 + math.ceil(mean_nodes / BEST_FIRST_PREFETCH)
    if builder == "threshold" and depth:
        return int(depth)
    return max(1, math.ceil(mean_nodes))


def draft_costs(costs: dict[str, Any], kind: str, spec: dict[str, Any], row: dict[str, Any],
                batch: int) -> dict[str, tuple[float, str]]:
    """variant -> (draft ms per step at this batch, source); empty when not measured."""
    if kind in ("dart", "jetspec", "diffusion"):
        r = _by_batch(costs.get("heads", {}).get(kind, {}).get("results", []), batch)
        out = {}
        if isinstance(r.get("step_eager_ms"), (int, float)):
            out["eager"] = (float(r["step_eager_ms"]), f"heads.{kind} step_eager_ms")
        if isinstance(r.get("core_graph_ms"), (int, float)):
            out["graph"] = (float(r["core_graph_ms"]), f"heads.{kind} core_graph_ms")
        return out
    if kind == "draft_lm":
        r = _by_batch(costs.get("draft_lm", {}).get("results", []), batch)
        calls = draft_lm_calls(spec, float(row["mean_nodes"]))
        out = {}
        chain = r.get("chain_graph_ms", {}).get(str(calls))
        if isinstance(chain, (int, float)):
            out["graph"] = (float(chain), f"draft_lm chain_graph_ms[{calls}]")
        elif isinstance(r.get("forward_graph_ms"), (int, float)):
            out["graph"] = (calls * float(r["forward_graph_ms"]), f"{calls} x draft_lm forward_graph_ms")
        if isinstance(r.get("forward_eager_ms"), (int, float)):
            out["eager"] = (calls * float(r["forward_eager_ms"]), f"{calls} x draft_lm forward_eager_ms")
        return out
    if kind in CPU_DRAFTERS:
        return {"cpu": (batch * float(row["draft_ms_per_step"]), f"{batch} x record draft_ms_per_step (CPU)")}
    return {}


# -- projection -----------------------------------------------------------------------------

def project_row(curve: dict[int, float], row: dict[str, Any], draft_ms: float) -> dict[str, float] | None:
    """The formula of the module docstring for one replay row; None if its rows were not measured."""
    t1 = curve.get(1)
    rows = 1.0 + float(row["mean_nodes"])
    tr = interpolate(curve, rows)
    if t1 is None or tr is None:
        return None
    f = row["drafted_steps"] / row["steps"] if row.get("steps") else 1.0
    step = f * tr + (1.0 - f) * t1 + draft_ms
    tps = float(row["tokens_per_step"])
    return {"query_rows": rows, "drafted_fraction": f, "target_rows_ms": tr, "target_1_ms": t1,
            "step_ms": step, "spec_ms_per_token": step / tps, "base_ms_per_token": t1,
            "speedup": t1 * tps / step}


def project(costs: dict[str, Any], files: list[Path], batches: list[int] | None = None) -> dict[str, Any]:
    """Every replay row x batch x draft-cost variant, plus the rows skipped and why."""
    inline = _inline_configs()
    batches = batches or sorted({int(r["batch"]) for r in costs.get("target", {}).get("results", [])})
    rows, skipped = [], []
    for path in files:
        record = json.loads(path.read_text())
        for raw in record.get("rows", []):
            source = f"{_rel(path)}: rows[config={raw.get('config')!r}, budget={raw.get('budget')}]"
            if not all(k in raw for k in ("tau", "tokens_per_step", "mean_nodes")):
                skipped.append({"source": source, "reason": "no tau / tokens_per_step / mean_nodes"})
                continue
            spec, spec_from = resolve_spec(raw, inline)
            kind = drafter_kind(spec, str(raw.get("treespec") or raw.get("config"))) if spec is not None else "unknown"
            for b in batches:
                variants = draft_costs(costs, kind, spec or {}, raw, b)
                if not variants:
                    skipped.append({"source": source, "batch": b, "drafter": kind,
                                    "reason": f"no GPU draft cost for drafter {kind!r} ({spec_from})"})
                    continue
                for variant, (ms, cost_from) in variants.items():
                    p = project_row(target_curve(costs, b), raw, ms)
                    if p is None:
                        skipped.append({"source": source, "batch": b, "drafter": kind,
                                        "reason": "query rows beyond the measured target curve"})
                        continue
                    rows.append({"source": source, "config": raw.get("config"), "budget": raw.get("budget"),
                                 "drafter": kind, "tree": tree_label(spec or {}), "spec_from": spec_from,
                                 "batch": b, "draft_variant": variant,
                                 "draft_ms": ms, "draft_cost_from": cost_from, "tau": raw["tau"],
                                 "tokens_per_step": raw["tokens_per_step"], "mean_nodes": raw["mean_nodes"], **p})
    return {"benchmark": "project_gpu_speedup", "device_name": costs.get("device_name"),
            "costs_torch": costs.get("torch"), "context": costs.get("context"),
            "target_attention": costs.get("method", {}).get("attention"), "notes": NOTES,
            "rows": rows, "skipped": skipped}


def _rel(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


# -- output ---------------------------------------------------------------------------------

def markdown(result: dict[str, Any]) -> str:
    """Best row per (B, drafter, variant) first, then every row (by B, speedup descending)."""
    head = ("| B | drafter | draft | config @ budget | tree | tau | tok/step | rows | draft ms | T(rows) ms "
            "| T(1) ms | ms/token | speedup | source |\n|" + "---|" * 14 + "\n")

    def line(r: dict[str, Any]) -> str:
        return (f"| {r['batch']} | {r['drafter']} | {r['draft_variant']} | {r['config']} @ {r['budget']} | {r['tree']} "
                f"| {r['tau']:.2f} | {r['tokens_per_step']:.2f} | {r['query_rows']:.1f} | {r['draft_ms']:.3f} "
                f"| {r['target_rows_ms']:.3f} | {r['target_1_ms']:.3f} | {r['spec_ms_per_token']:.3f} "
                f"| {r['speedup']:.2f}x | {r['source'].split(':')[0]} |\n")

    rows = sorted(result["rows"], key=lambda r: (r["batch"], -r["speedup"]))
    best: dict[tuple, dict[str, Any]] = {}
    for r in rows:
        best.setdefault((r["batch"], r["drafter"], r["draft_variant"]), r)
    out = [f"# Projected GPU speedup ({result['device_name']}, context {result['context']}, "
           f"target attention {result['target_attention']})\n\n",
           *[f"- {n}\n" for n in result["notes"]], "\n## Best config per drafter\n\n", head,
           *[line(r) for r in sorted(best.values(), key=lambda r: (r["batch"], -r["speedup"]))],
           "\n## All rows\n\n", head, *[line(r) for r in rows]]
    if result["skipped"]:
        out += ["\n## Skipped\n\n", *[f"- {s['source']}"
                                      + (f" B={s['batch']}" if "batch" in s else "") + f": {s['reason']}\n"
                                      for s in result["skipped"]]]
    return "".join(out)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--costs", type=Path, required=True, help="gpu_forward_costs.json or its directory")
    p.add_argument("--records", type=Path, nargs="+", default=None,
                   help="replay records (default: benchmarks/results/replay_tau_*.json)")
    p.add_argument("--batches", type=int, nargs="+", default=None, help="default: every B in the costs")
    p.add_argument("--out", type=Path, required=True, help="directory for project_gpu_speedup.{json,md}")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    ns = parse_args(argv)
    files = ns.records or sorted(RESULTS.glob("replay_tau_*.json"))
    result = project(load_costs(ns.costs), files, ns.batches)
    ns.out.mkdir(parents=True, exist_ok=True)
    (ns.out / "project_gpu_speedup.json").write_text(json.dumps(result, indent=1) + "\n")
    md = markdown(result)
    (ns.out / "project_gpu_speedup.md").write_text(md)
    print(md.split("\n## All rows")[0])
    print(f"wrote {ns.out / 'project_gpu_speedup.json'} and .md ({len(result['rows'])} rows, "
          f"{len(result['skipped'])} skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
