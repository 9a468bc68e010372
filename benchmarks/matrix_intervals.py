"""Bootstrap intervals of a regime matrix's cells, from one record or several pooled.

Why: a cell's ratio (`bench_matrix.py`) is the median of a few paired turns, and an identical
second `off` server reads several percent either side of 1 on it. Whether a preset's 0.965 lies
under a 0.97 bar or inside the instrument's spread takes the cell's own spread. This resamples
each cell's paired turns with replacement (seeded, harness/paired_stats.py) and reports the
median's two-sided interval; the records of reruns of one build (same configs and cells) may be
pooled, turn pairs from all of them, for a narrower interval. A cell reads `under` when its whole
interval lies below the bar, `over` when it lies at or above it, else `open`.

`--measure raw` (the default, the acceptance measure): every cell's raw paired tokens/s ratio.
`--measure steady`: the raw ratio of each turn's steady part (streamed records: tokens/s while
every client had a request in flight, the turn without its drain; `LoadResult.steady`).
`--measure drift-corrected`: sampled cells' drift-corrected ratio (each turn's seconds over the
server's own forward seconds), shown beside the raw one to explain a result, never in its place;
greedy cells are skipped there (speculation changes the rows their forward runs).

    .venv/bin/python benchmarks/matrix_intervals.py benchmarks/results/bench_matrix_A.json \
        [benchmarks/results/bench_matrix_B.json ...] [--measure raw] [--bar 0.97] [--level 0.9] [--output X.json]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_matrix import (BASELINE, _corrected_turns, _steady_turns, _turns, corrected_turn_ratios,  # noqa: E402
                          turn_ratios as raw_turn_ratios)
from harness.paired_stats import median_interval, verdict  # noqa: E402

MEASURES = ("raw", "steady", "drift-corrected")


def turn_ratios(records: Sequence[dict[str, Any]], regime: str, label: str, measure: str = "raw") -> list[float]:
    """The ratio (`measure`) of every paired turn of one cell and config, over the records."""
    out = []
    for record in records:
        for cell in record["cells"]:
            if cell["regime"] != regime or label not in cell["configs"]:
                continue
            rounds = cell["configs"][label].get("rounds") or []
            offs = cell["configs"][BASELINE].get("rounds") or []
            for entry, off in zip(rounds, offs):
                if measure == "raw":
                    out += raw_turn_ratios(_turns(entry, off))
                elif measure == "steady":
                    out += raw_turn_ratios(_steady_turns(entry, off))
                else:
                    out += corrected_turn_ratios(_corrected_turns(entry, off))
    return out


def intervals(records: Sequence[dict[str, Any]], bar: float = 0.97, level: float = 0.9,
              measure: str = "raw") -> list[dict[str, Any]]:
    """Per cell (the first record's order) and config but the baseline: turns, median, interval
    and verdict. Drift-corrected: greedy cells are skipped (speculation changes the rows their
    forward runs), and so are cells without forward seconds."""
    if measure not in MEASURES:
        raise ValueError(f"measure must be one of {MEASURES}, got {measure!r}")
    rows = []
    for cell in records[0]["cells"]:
        if measure == "drift-corrected" and not cell.get("temperature"):
            continue
        for label in cell["configs"]:
            if label == BASELINE:
                continue
            ratios = turn_ratios(records, cell["regime"], label, measure)
            interval = median_interval(ratios, level)
            if interval is None:
                continue
            rows.append({"regime": cell["regime"], "config": label, "turns": len(ratios),
                         "median": interval[0], "low": interval[1], "high": interval[2],
                         "verdict": verdict(interval, bar)})
    return rows


def markdown(rows: Sequence[dict[str, Any]], level: float) -> str:
    lines = [f"| regime | config | turns | median | {level:.0%} interval | verdict |", "| --- | --- | ---: | ---: | --- | --- |"]
    for r in rows:
        lines.append(f"| {r['regime']} | {r['config']} | {r['turns']} | {r['median']:.3f} | "
                     f"{r['low']:.3f}-{r['high']:.3f} | {r['verdict']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", type=Path, help="bench_matrix records; several are pooled")
    ap.add_argument("--measure", choices=MEASURES, default="raw",
                    help="raw paired tokens/s ratios of whole turns, of their steady parts (streamed "
                         "records), or drift-corrected ones")
    ap.add_argument("--bar", type=float, default=0.97, help="the ratio a cell is judged against")
    ap.add_argument("--level", type=float, default=0.9, help="two-sided interval level")
    ap.add_argument("--output", type=Path, default=None, help="JSON record path")
    ns = ap.parse_args(argv)
    if not 0.0 < ns.level < 1.0:
        ap.error(f"--level must lie between 0 and 1, got {ns.level}")
    records = [json.loads(p.read_text()) for p in ns.records]
    for p, record in zip(ns.records, records):
        if record.get("benchmark") != "bench_matrix":
            ap.error(f"{p}: not a bench_matrix record")
    rows = intervals(records, ns.bar, ns.level, ns.measure)
    print(markdown(rows, ns.level))
    if ns.output:
        ns.output.write_text(json.dumps({
            "benchmark": "matrix_intervals", "records": [str(p) for p in ns.records],
            "commits": [r.get("software", {}).get("git_commit") for r in records],
            "measure": ns.measure, "bar": ns.bar, "level": ns.level, "resamples": 4000, "rows": rows},
            indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
