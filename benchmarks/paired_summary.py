"""A table of bench_paired records: raw and drift-corrected ratios side by side.

Why: records written before bench_paired reported its drift-corrected ratio keep every turn's
seconds and forward seconds, so the corrected figure can be read from them with the same
formula (`bench_paired.drift_corrected`); docs/never-slower.md quotes tables made this way.

    .venv/bin/python benchmarks/paired_summary.py benchmarks/results/bench_paired_c*_unseen*_code-lm.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def summary_row(record: dict) -> dict:
    """The figures of one record (bench_paired's JSON)."""
    from bench_paired import drift_corrected

    corrected, corrected_median = drift_corrected(record["pairs"])
    return {"b": record["b"], "temperature": record["temperature"], "concurrency": record.get("concurrency", 1),
            "raw": record["speedup_b_over_a"], "raw_median": record["pair_ratio_median"],
            "corrected": corrected, "corrected_median": corrected_median,
            "tokens_per_step": (record["a_tokens_per_step"], record["b_tokens_per_step"]),
            "pairs": len(record["pairs"])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="+", type=Path)
    ns = ap.parse_args(argv)
    print("| record | T | clients | pairs | B/A raw (median) | drift-corrected (median) | tokens/step A, B |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for path in ns.records:
        r = summary_row(json.loads(path.read_text()))
        corrected = "-" if r["corrected"] is None else f"{r['corrected']:.3f} ({r['corrected_median']:.3f})"
        print(f"| `{path.stem}` | {r['temperature']} | {r['concurrency']} | {r['pairs']} | "
              f"{r['raw']:.3f} ({r['raw_median']:.3f}) | {corrected} | "
              f"{r['tokens_per_step'][0]:.2f}, {r['tokens_per_step'][1]:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
