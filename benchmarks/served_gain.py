"""What budget.gain decides on a served run: one server, unseen prompts (chat requests for a model
with a chat template, answered to EOS) at a fixed concurrency and temperature, then its
treespec_gain_* and tree series read from /metrics (docs/metrics.md).

Why served: the engine core and the worker are separate processes there, and the step costs the
controller fits are the served ones, not an offline engine's. For diagnosing decisions, not a
speed comparison (no paired baseline: use bench_matrix.py).

    .venv/bin/python benchmarks/served_gain.py --config default:12 --temperature 0 --concurrency 8 \
        --output benchmarks/results/served_gain_t0_c8_code-lm.json
    .venv/bin/python benchmarks/served_gain.py --fixture smollm2-135m --config default:24 --num-prompts 32
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

SERIES = ("treespec_gain_decisions_total", "treespec_gain_cost_tokens", "treespec_gain_step_seconds",
          "treespec_tree_nodes_sum", "treespec_tree_nodes_count", "treespec_accepted_depth_sum",
          "treespec_draft_seconds_sum", "treespec_draft_seconds_count",
          "treespec_worker_step_seconds_sum", "treespec_worker_step_seconds_count",
          "treespec_verify_seconds_sum", "treespec_accept_seconds_sum", "treespec_compaction_seconds_sum",
          "treespec_tree_attention_seconds_sum", "treespec_guard_ratio", "treespec_guard_drafting")
GAUGES = ("treespec_gain_cost_tokens", "treespec_gain_step_seconds", "treespec_guard_ratio",
          "treespec_guard_drafting")   # the rest of SERIES are counters


def parse_series(text: str) -> dict[str, float]:
    """Prometheus text -> {'name' or 'name{label}': value} for SERIES, the model label dropped."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        m = re.match(r"^([a-zA-Z_:]+)(\{[^}]*\})? ([0-9.eE+-]+)$", line)
        if not m or m.group(1) not in SERIES:
            continue
        extra = [kv for kv in re.findall(r'(\w+)="([^"]*)"', m.group(2) or "") if kv[0] != "model_name"]
        key = m.group(1) + ("{" + ",".join(f"{k}={v}" for k, v in extra) + "}" if extra else "")
        out[key] = out.get(key, 0.0) + float(m.group(3))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fixture", default="code-lm")
    ap.add_argument("--model-dir", default=None)
    ap.add_argument("--config", default="default:12", help="a bench_matrix.py config spec")
    ap.add_argument("--temperature", type=float, default=0.0)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--output", type=Path, default=None)
    ns = ap.parse_args(argv)

    from bench_matrix import build_prompt_sets, parse_configs, prompt_kind, serve_args_default_dtype
    from bench_serving import resolve_model
    from harness.report import hardware_info, software_info
    from harness.serving import CPU_SERVE_ARGS, run_load, serve

    _, model_dir, _ = resolve_model(ns)
    cfg = parse_configs([ns.config])[-1]
    kind = prompt_kind("auto", Path(model_dir))
    (prompts,), warm, _ = build_prompt_sets(kind, [ns.num_prompts], ns.concurrency, seed=13)
    pool = list(prompts) + list(warm)
    ignore_eos = kind == "code"             # chat answers end where the model ends them
    with serve(model_dir, cfg.args, base_args=serve_args_default_dtype(CPU_SERVE_ARGS), keep_log=True) as server:
        run_load(server, pool[ns.num_prompts:], max_tokens=32, concurrency=ns.concurrency,
                 temperature=ns.temperature, ignore_eos=ignore_eos)
        before = parse_series(urllib.request.urlopen(server.base_url + "/metrics", timeout=10).read().decode())
        load = run_load(server, pool[:ns.num_prompts], max_tokens=ns.max_tokens,
                        concurrency=ns.concurrency, temperature=ns.temperature, ignore_eos=ignore_eos)
        after = parse_series(urllib.request.urlopen(server.base_url + "/metrics", timeout=10).read().decode())
        log = server.log_path
    guard = [line.split("TreeProposer: ", 1)[-1] for line in log.read_text(errors="replace").splitlines()
             if "budget.gain.guard" in line]
    log.unlink(missing_ok=True)
    counters = {k: after[k] - before.get(k, 0.0) for k in after if not k.startswith(GAUGES)}
    gauges = {k: v for k, v in after.items() if k not in counters}
    record = {"benchmark": "served_gain", "hardware": hardware_info(), "software": software_info(),
              "settings": vars(ns) | {"output": str(ns.output) if ns.output else None},
              "prompts": kind, "tokens_per_s": load.tokens_per_s, "during_load": counters, "last_values": gauges,
              "guard_log": guard}
    text = json.dumps(record, indent=1)
    print(text)
    if ns.output:
        ns.output.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
