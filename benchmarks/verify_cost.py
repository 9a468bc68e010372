"""The verify-cost curve, served: engine step time against the rows a step verifies.

Every budget decision rests on how much a verified row costs. This measures it where it is paid:
one OpenAI server (`vllm-treespec serve`, vLLM's default dtype) with treespec prompt-lookup
trees over a prompt of random tokens from a 16-token alphabet, so that every suffix of the
context matches many earlier positions with different continuations and the drafter fills any
budget. Each request carries `vllm_xargs.treespec_max_nodes = N`, so its every step verifies
1 + N rows (budget.gain off; a chain deployment beside it for chains), at contexts of
--contexts tokens. A step's time is a request's wall seconds less its prefill (the median wall
of one-token requests at that context, each prompt fresh so the prefix cache never serves it)
over its engine steps after the first (output tokens minus accepted drafts, from vLLM's
spec-decode counters, minus one); `off` (no speculation) gives the plain step at each context
for the ratio. The model copies some of the random context, so steps accept drafts and a
request near its end gets fewer nodes than N (at most the tokens it has left); a point's `rows`
is what its steps verified on average (1 + drafted nodes / drafted steps).

    .venv/bin/python benchmarks/verify_cost.py                     # smollm2-135m, rows 1..129, contexts 512 2048
    .venv/bin/python benchmarks/verify_cost.py --fixture code-lm --contexts 512 --nodes 0 8 32

Writes results/verify_cost_<fixture>.json and a PNG of the curves beside it.
"""
from __future__ import annotations

import argparse
import datetime as dt
import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

import treespec_fixtures  # noqa: E402,F401

RESULTS = _HERE / "results"
ALPHABET = 16
# One-token matches only: the last token occurs about context/16 times before, each followed by
# a different random continuation, so the merged tree has far more nodes than any budget.
_LOOKUP = {"type": "prompt_lookup", "min_ngram": 1, "max_ngram": 1, "max_matches": 16}
TREE = {"drafter": _LOOKUP, "tree": {"builder": "best_first"}, "budget": {"gain": {"enabled": False}}}
CHAIN = {"drafter": _LOOKUP, "tree": {"builder": "chain"}, "budget": {"gain": {"enabled": False}}}


def random_prompt(length: int, vocab_start: int, seed: int) -> list[int]:
    """`length` token ids drawn uniformly from ALPHABET consecutive ids (no special tokens)."""
    rng = random.Random(seed)
    return [vocab_start + rng.randrange(ALPHABET) for _ in range(length)]


def step_seconds(wall_s: float, prefill_s: float, output_tokens: int, accepted: float) -> float | None:
    """Seconds per decode step of one request: every step emits one token plus its accepted
    drafts, and the first comes with the prefill (`prefill_s`: a one-token request's wall)."""
    steps = output_tokens - accepted - 1
    return (wall_s - prefill_s) / steps if steps > 0 else None


def main(argv: list[str] | None = None) -> int:
    from bench_matrix import serve_args_default_dtype
    from harness.comparison import treespec
    from harness.report import hardware_info, hardware_line, software_info
    from harness.serving import CPU_SERVE_ARGS, run_load, scrape_spec_metrics, serve
    from treespec_fixtures import build_fixture

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixture", default="smollm2-135m")
    p.add_argument("--contexts", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--nodes", type=int, nargs="+", default=[0, 1, 3, 7, 15, 31, 63, 127],
                   help="draft nodes per step (rows verified = 1 + nodes)")
    p.add_argument("--shapes", nargs="+", default=["tree", "chain"], choices=["tree", "chain"])
    p.add_argument("--max-tokens", type=int, default=160)
    p.add_argument("--repeats", type=int, default=3, help="requests per point (the median is kept)")
    p.add_argument("--idle-gap", type=float, default=1.5)
    p.add_argument("--output", type=Path, default=None)
    ns = p.parse_args(argv)

    model = build_fixture(ns.fixture)
    max_len = max(ns.contexts) + ns.max_tokens + 64
    base = [a for a in serve_args_default_dtype(CPU_SERVE_ARGS)]
    i = base.index("--max-model-len")
    base[i + 1] = str(max_len)
    k = max(ns.nodes)
    servers = {"off": ()}
    for shape in ns.shapes:
        servers[shape] = treespec(k, TREE if shape == "tree" else CHAIN).args
    hw = hardware_info()
    print(hardware_line(hw), file=sys.stderr)
    points: list[dict[str, Any]] = []
    t0 = time.time()
    for name, args in servers.items():
        with serve(model, args, base_args=base, env={"VLLM_CPU_KVCACHE_SPACE": "2"}) as s:
            warm = random_prompt(128, 100, seed=999)
            run_load(s, [warm], max_tokens=8)
            seed = 0
            for ctx in ns.contexts:
                walls = []
                for _ in range(ns.repeats):
                    seed += 1
                    time.sleep(ns.idle_gap)
                    walls.append(run_load(s, [random_prompt(ctx, 100, seed=seed)], max_tokens=1).wall_s)
                prefill = statistics.median(walls)
                for n in ([0] if name == "off" else ns.nodes):
                    secs, drafted, drafts = [], 0.0, 0.0
                    for r in range(ns.repeats):
                        seed += 1
                        prompt = random_prompt(ctx, 100, seed=seed)
                        before = scrape_spec_metrics(s)
                        time.sleep(ns.idle_gap)
                        extra = None if name == "off" else {"vllm_xargs": {"treespec_max_nodes": n}}
                        load = run_load(s, [prompt], max_tokens=ns.max_tokens, extra=extra)
                        d = scrape_spec_metrics(s) - before
                        sec = step_seconds(load.wall_s, prefill, load.output_tokens, d.accepted if d.present else 0.0)
                        if sec is not None:
                            secs.append(sec)
                        if d.present:
                            drafted, drafts = drafted + d.draft_tokens, drafts + d.drafts
                    mean_nodes = drafted / drafts if drafts else 0.0
                    point = {"server": name, "context": ctx, "nodes": n,
                             "rows": round(1 + mean_nodes, 2),     # as verified: caps cut the tail
                             "prefill_ms": round(1e3 * prefill, 1),
                             "step_ms": round(1e3 * statistics.median(secs), 3) if secs else None,
                             "step_ms_repeats": [round(1e3 * x, 3) for x in secs],
                             "drafted_steps": drafts}
                    points.append(point)
                    print(json.dumps(point), file=sys.stderr, flush=True)
        time.sleep(ns.idle_gap)
    plain = {pt["context"]: pt["step_ms"] for pt in points if pt["server"] == "off"}
    for pt in points:
        if pt["step_ms"] and plain.get(pt["context"]):
            pt["vs_plain_step"] = round(pt["step_ms"] / plain[pt["context"]], 3)
    record = {"benchmark": "verify_cost", "started_utc": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
              "wall_s": round(time.time() - t0, 1), "hardware": hw, "software": software_info(),
              "model": {"fixture": ns.fixture, "dir_name": model.name}, "serve_args": base,
              "settings": {"contexts": ns.contexts, "nodes": ns.nodes, "max_tokens": ns.max_tokens,
                           "repeats": ns.repeats, "tree": TREE, "chain": CHAIN, "alphabet": ALPHABET},
              "points": points}
    out = ns.output or RESULTS / f"verify_cost_{ns.fixture}.json"
    out.write_text(json.dumps(record, indent=2) + "\n")
    plot(points, out.with_suffix(".png"), f"verify cost, {ns.fixture}, served\n{hardware_line(hw)}")
    print(table(points))
    print(f"wrote {out}")
    return 0


def table(points: Sequence[dict[str, Any]]) -> str:
    lines = ["| server | context | rows | step ms | vs plain step |", "| --- | ---: | ---: | ---: | ---: |"]
    for pt in points:
        lines.append(f"| {pt['server']} | {pt['context']} | {pt['rows']} | {pt['step_ms']} | {pt.get('vs_plain_step', '-')} |")
    return "\n".join(lines)


def plot(points: Sequence[dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for server in sorted({p["server"] for p in points} - {"off"}):
        for ctx in sorted({p["context"] for p in points}):
            pts = [p for p in points if p["server"] == server and p["context"] == ctx and p.get("vs_plain_step")]
            ax.plot([p["rows"] for p in pts], [p["vs_plain_step"] for p in pts], marker="o", label=f"{server}, context {ctx}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("rows verified per step (1 + draft nodes)")
    ax.set_ylabel("step time / plain step")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
