"""Headless locust sweep (issue 9): users x configs against a fixture server, side by side.

For each config (no speculation, treespec with fixed budgets, with the CPU budget table, with the
auto budget) one server is started; for each user count locust runs `benchmarks/locustfile.py`
headless for --seconds, and the run's output tokens per second (all OK requests' tokens / the span
import treespec_fixtures  # noqa: F401  (fixture: paths and demo/ presets, here and in servers)
from the first request's start to the last one's end), TTFT and TPOT percentiles, failures and
the server's spec-decode counters are recorded. Writes JSON + CSV + PNG (throughput and TPOT vs
users) to benchmarks/results/.

    .venv/bin/python benchmarks/load_sweep.py                         # users 1 4 16 64, 60 s each
    .venv/bin/python benchmarks/load_sweep.py --users 1 16 --seconds 30 --configs off auto

Greedy (temperature 0) unless --temperature; prompts and lengths: see the locustfile.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

HERE = Path(__file__).resolve().parent
RESULTS = HERE / "results"
LOCUSTFILE = HERE / "locustfile.py"
CHAT_TEMPLATE = HERE / "chat_template.jinja"
DRAFTER = "demo/lookup-trie-tree"     # the best treespec drafter on the code-LM fixture at 1 client


def configs(num_spec: int) -> dict[str, tuple[str, ...]]:
    """name -> extra `serve` flags."""
    from harness.comparison import treespec

    def ts(budget: dict[str, Any], k: int = num_spec) -> tuple[str, ...]:
        return treespec(k, _preset_with_budget(DRAFTER, budget)).args
    out: dict[str, tuple[str, ...]] = {"off": ()}
    for k in (4, 8, 16):
        if k <= num_spec:
            out[f"fixed-{k}"] = ts({"max_nodes": k})
    out["table-cpu"] = ts({"mode": "table", "preset": "cpu"})
    out["auto"] = ts({"mode": "auto"})
    return out


def _preset_with_budget(preset: str, budget: dict[str, Any]) -> dict[str, Any]:
    """A drafter preset's mapping with its budget section replaced."""
    import yaml

    from vllm_treespec.config import resolve_path

    raw = yaml.safe_load(resolve_path(preset).read_text())
    raw["budget"] = budget
    return raw


def run_locust(base_url: str, users: int, seconds: float, workdir: Path, *, env: dict[str, str] | None = None,
               locustfile: Path = LOCUSTFILE) -> dict[str, Any]:
    """One headless locust run; returns the summary of its per-request log and locust's totals."""
    workdir.mkdir(parents=True, exist_ok=True)
    log = workdir / f"requests-u{users}.jsonl"
    log.unlink(missing_ok=True)
    full_env = {**os.environ, **(env or {}), "TREESPEC_LOCUST_LOG": str(log)}
    cmd = [sys.executable, "-m", "locust", "-f", str(locustfile), "--host", base_url, "--headless",
           "-u", str(users), "-r", str(users), "--run-time", f"{int(seconds)}s", "--stop-timeout", "120",
           "--csv", str(workdir / f"u{users}"), "--only-summary", "--exit-code-on-error", "0"]
    proc = subprocess.run(cmd, env=full_env, capture_output=True, text=True, timeout=seconds + 600)
    if proc.returncode != 0:
        raise RuntimeError(f"locust failed ({proc.returncode}): {proc.stderr[-2000:]}")
    return summarize(log, workdir / f"u{users}_stats.csv", users)


def _pct(values: Sequence[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]


def summarize(log: Path, stats_csv: Path, users: int) -> dict[str, Any]:
    records = [json.loads(line) for line in log.read_text().splitlines() if line.strip()] if log.exists() else []
    ok = [r for r in records if r.get("ok")]
    failed = len(records) - len(ok)
    with open(stats_csv) as fh:
        rows = list(csv.DictReader(fh))
    totals = next((r for r in rows if r.get("Name") == "Aggregated"), {})
    locust_failures = int(float(totals.get("Failure Count", 0) or 0))
    span = (max(r["end"] for r in ok) - min(r["start"] for r in ok)) if ok else 0.0
    tokens = sum(r["tokens"] for r in ok)
    ttft = [r["ttft_s"] for r in ok if "ttft_s" in r]
    tpot = [r["tpot_s"] for r in ok if "tpot_s" in r]
    return {"users": users, "requests": len(ok), "failed": max(failed, 0), "locust_failures": locust_failures,
            "output_tokens": tokens, "span_s": span, "tokens_per_s": tokens / span if span > 0 else None,
            "ttft_p50_ms": _ms(_pct(ttft, 0.5)), "ttft_p90_ms": _ms(_pct(ttft, 0.9)),
            "tpot_p50_ms": _ms(_pct(tpot, 0.5)), "tpot_p90_ms": _ms(_pct(tpot, 0.9))}


def _ms(v: float | None) -> float | None:
    return None if v is None else 1e3 * v


def plot(rows: list[dict[str, Any]], path: Path, title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for name in dict.fromkeys(r["config"] for r in rows):
        mine = [r for r in rows if r["config"] == name]
        users = [r["users"] for r in mine]
        axes[0].plot(users, [r["tokens_per_s"] or 0 for r in mine], marker="o", label=name)
        axes[1].plot(users, [r["tpot_p50_ms"] or 0 for r in mine], marker="o", label=name)
    for ax, what in zip(axes, ("output tokens/s", "TPOT p50 ms (streaming)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("users")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixture", default="code-lm")
    p.add_argument("--users", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--seconds", type=float, default=60.0, help="locust run time per (config, users)")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=16)
    p.add_argument("--configs", nargs="+", default=None, help="subset of: off fixed-4 fixed-8 fixed-16 table-cpu auto")
    p.add_argument("--max-tokens", default="16-128", help="TREESPEC_LOCUST_MAX_TOKENS")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--output", type=Path, default=RESULTS / "load_sweep_code-lm.json")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    from treespec_fixtures import build_fixture
    from harness.report import hardware_info, hardware_line, software_info
    from harness.serving import scrape_spec_metrics, serve

    ns = parse_args(argv)
    table = configs(ns.num_speculative_tokens)
    names = ns.configs or list(table)
    unknown = [n for n in names if n not in table]
    if unknown:
        print(f"--configs: unknown {unknown}; choose from {list(table)}", file=sys.stderr)
        return 2
    model = build_fixture(ns.fixture)
    env = {"TREESPEC_LOCUST_MAX_TOKENS": ns.max_tokens, "TREESPEC_LOCUST_TEMPERATURE": str(ns.temperature)}
    base = ("--max-num-seqs", str(ns.max_num_seqs), "--chat-template", str(CHAT_TEMPLATE))
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            print(f"[{name}] starting server ...", flush=True)
            with serve(model, (*base, *table[name])) as server:
                for users in ns.users:
                    before = scrape_spec_metrics(server, settle_s=0)
                    row = run_locust(server.base_url, users, ns.seconds, Path(tmp) / name, env=env)
                    spec = scrape_spec_metrics(server) - before
                    row.update(config=name, tau=spec.tau, budget_mean=_mean_budget(spec))
                    rows.append(row)
                    print(f"[{name}] users {users}: {row['tokens_per_s'] or 0:.1f} tok/s, "
                          f"TPOT p50 {row['tpot_p50_ms'] or 0:.1f} ms, failed {row['failed']}", flush=True)
    hw = hardware_info()
    record = {"benchmark": "load_sweep", "hardware": hw, "software": software_info(),
              "model": {"fixture": ns.fixture, "dir_name": Path(model).name}, "drafter": DRAFTER,
              "num_speculative_tokens": ns.num_speculative_tokens, "seconds": ns.seconds,
              "max_tokens": ns.max_tokens, "temperature": ns.temperature, "max_num_seqs": ns.max_num_seqs,
              "rows": rows, "command": "benchmarks/load_sweep.py " + " ".join(argv if argv is not None else sys.argv[1:])}
    ns.output.parent.mkdir(parents=True, exist_ok=True)
    ns.output.write_text(json.dumps(record, indent=2) + "\n")
    with open(ns.output.with_suffix(".csv"), "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    print(ns.output)
    print(plot(rows, ns.output.with_suffix(".png"), f"locust sweep, {ns.fixture}, {hardware_line(hw)}"))
    return 0


def _mean_budget(spec: Any) -> float | None:
    count = spec.tree.get("treespec_budget_nodes_count", 0.0)
    return spec.tree.get("treespec_budget_nodes_sum", 0.0) / count if count else None


if __name__ == "__main__":
    sys.exit(main())
