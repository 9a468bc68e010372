"""Profile served vLLM processes (API server, engine core) under load, one config at a time.

Why: a speculative server with nothing drafted measured slower than no speculation served, but
not offline; this shows where each serving process spends its time per generated token. Each
config gets its own server (started alone, warmed up), then `py-spy record --subprocesses`
samples every process of its group while `--concurrency` clients replay unseen prompts. Output:
the raw collapsed stacks per config (in a temp dir), and a table of inclusive samples per function (per 1000
output tokens), configs side by side.

Needs py-spy (`pip install py-spy`, any location; pass --py-spy if it is not on PATH).

    .venv/bin/python benchmarks/profile_serving.py --configs off-sync \
        benchmarks/configs/drafting-off.yaml:12 --temperature 0.7 --concurrency 8
"""
from __future__ import annotations

import treespec_fixtures  # noqa: F401  (fixture: paths and demo/ presets, here and in servers)
import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

RESULTS = Path(__file__).resolve().parent / "results"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--fixture", default="code-lm")
    p.add_argument("--model-dir", default=None)
    p.add_argument("--configs", nargs="+", required=True, metavar="SPEC", help="bench_matrix.py config specs")
    p.add_argument("--num-prompts", type=int, default=32)
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    p.add_argument("--py-spy", default=shutil.which("py-spy") or "py-spy")
    p.add_argument("--top", type=int, default=45, help="functions in the table")
    p.add_argument("--output", type=Path, default=None, help="table path (default results/profile_serving_...)")
    return p.parse_args(argv)


SINGLE_PROCESS = "(one process)"     # the process of stacks recorded without --subprocesses


def inclusive_counts(raw: str) -> tuple[collections.Counter, dict[str, int]]:
    """Collapsed stacks ("proc;frame;frame count") -> samples per frame (counted once per stack) and
    samples per process (py-spy's process label, the innermost one; SINGLE_PROCESS for a stack
    without one, as py-spy records a single process)."""
    frames: collections.Counter = collections.Counter()
    procs: dict[str, int] = collections.defaultdict(int)
    for line in raw.splitlines():
        stack, _, count = line.rstrip().rpartition(" ")
        if not stack or not count.isdigit():
            continue
        n = int(count)
        parts = stack.split(";")
        marks = [i for i, p in enumerate(parts) if p.startswith("process ")]
        if marks:
            inner = marks[-1]                  # py-spy nests child processes under their parents
            procs[_process_label(parts[inner])] += n
            parts = parts[inner + 1:]
        else:
            procs[SINGLE_PROCESS] += n
        for frame in {_short(p) for p in parts}:     # recursion counts once
            frames[frame] += n
    return frames, procs


def _process_label(frame: str) -> str:
    """'process 123:"VLLM::Worker"' -> 'VLLM::Worker' (the API server: its command, shortened)."""
    name = frame.split(":", 1)[1].strip('"') if ":" in frame else frame
    return name if name.startswith("VLLM::") else "API server (" + name.split(" -m ")[-1][:40] + ")"


def _short(frame: str) -> str:
    """'fn (path/to/module.py:123)' -> 'fn (module.py)'; line numbers dropped so calls merge."""
    name, _, where = frame.partition(" (")
    file = where.split(":")[0].rsplit("/", 1)[-1]
    return f"{name} ({file})" if file else name


def profile_one(cfg: Any, model_dir: Path, base_args: tuple[str, ...], prompts: list[str], warmup: list[str],
                ns: argparse.Namespace, out_dir: Path) -> dict[str, Any]:
    from harness.serving import run_load, serve

    raw_path = out_dir / f"{cfg.label.replace(' ', '_').replace('/', '_')}.raw.txt"   # collapsed stacks
    with serve(model_dir, cfg.args, base_args=base_args) as server:
        run_load(server, warmup, max_tokens=32, concurrency=ns.concurrency, temperature=ns.temperature)
        time.sleep(1.5)
        spy = subprocess.Popen([ns.py_spy, "record", "--pid", str(server.proc.pid), "--subprocesses",
                                "--rate", str(ns.rate), "--format", "raw", "--output", str(raw_path),
                                "--nonblocking"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        time.sleep(2.0)            # py-spy attaches
        load = run_load(server, prompts, max_tokens=ns.max_tokens, concurrency=ns.concurrency,
                        temperature=ns.temperature)
        spy.send_signal(2)         # SIGINT: py-spy writes what it has
        _, err = spy.communicate(timeout=60)
    raw = raw_path.read_text() if raw_path.exists() else ""
    if not raw:
        raise SystemExit(f"py-spy recorded nothing for {cfg.label}: {err.decode()[-500:]}")
    frames, procs = inclusive_counts(raw)
    return {"label": cfg.label, "tokens": load.output_tokens, "wall_s": load.wall_s,
            "tok_s": load.output_tokens / load.wall_s, "frames": frames, "procs": dict(procs),
            "raw": str(raw_path)}


def table(results: list[dict[str, Any]], top: int) -> str:
    per_k = [1000.0 / r["tokens"] for r in results]
    union: collections.Counter = collections.Counter()
    for r, k in zip(results, per_k):
        for f, n in r["frames"].items():
            union[f] = max(union[f], n * k)
    lines = ["samples per 1000 output tokens (inclusive; higher = more time)", "",
             "| function | " + " | ".join(r["label"] for r in results) + " |",
             "| --- |" + " --- |" * len(results)]
    for f, _ in union.most_common(top):
        lines.append(f"| `{f}` | " + " | ".join(f"{r['frames'].get(f, 0) * k:.0f}"
                                                for r, k in zip(results, per_k)) + " |")
    lines += ["", "| process | " + " | ".join(r["label"] for r in results) + " |",
              "| --- |" + " --- |" * len(results)]
    for p in sorted({p for r in results for p in r["procs"]}):
        lines.append(f"| {p} | " + " | ".join(f"{r['procs'].get(p, 0) * k:.0f}"
                                              for r, k in zip(results, per_k)) + " |")
    lines += ["", "| | " + " | ".join(r["label"] for r in results) + " |", "| --- |" + " --- |" * len(results),
              "| tok/s under the profiler | " + " | ".join(f"{r['tok_s']:.0f}" for r in results) + " |"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    from bench_matrix import parse_configs, serve_args_default_dtype
    from bench_serving import resolve_model
    from unseen_prompts import build_prompts
    from treespec_fixtures.prebuild import prebuild_engine_fixtures
    from harness.report import hardware_info, hardware_line
    from harness.serving import CPU_SERVE_ARGS

    ns = parse_args(argv)
    configs = parse_configs(ns.configs)
    _, model_dir, _ = resolve_model(ns)
    for c in configs:
        if c.kind == "treespec":
            prebuild_engine_fixtures(c.engine_kwargs, model_dir)
    pool = build_prompts(ns.num_prompts + ns.concurrency, seed=1)
    prompts = [p.text for p in pool[:ns.num_prompts]]
    warmup = [p.text for p in pool[ns.num_prompts:]]
    stem = f"profile_serving_t{ns.temperature:g}_c{ns.concurrency}_{ns.fixture}".replace(".", "")
    out_dir = Path(tempfile.mkdtemp(prefix=stem + "_"))     # raw stacks: megabytes, not committed
    base_args = serve_args_default_dtype(CPU_SERVE_ARGS)
    results = [profile_one(c, model_dir, base_args, prompts, warmup, ns, out_dir) for c in configs]
    header = (f"# Served profile, {ns.num_prompts} unseen prompts x {ns.max_tokens} tokens, "
              f"{ns.concurrency} clients, T={ns.temperature:g}, py-spy {ns.rate} Hz\n"
              f"# {hardware_line(hardware_info())}\n# rerun: {' '.join(sys.argv)}\n\n")
    text = header + table(results, ns.top)
    out = ns.output or RESULTS / f"{stem}.md"
    out.write_text(text)
    print(text)
    print(f"wrote {out}; raw stacks in {out_dir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
