"""PNG of a serving benchmark record (bench_serving / bench_draft_model JSON): tokens/s per
config and concurrency, tau on the bars, hardware in the title. The benchmarks write this PNG
themselves; this script re-renders committed records.

    .venv/bin/python benchmarks/plot_results.py benchmarks/results/bench_serving_lookup_trie_code-lm.json
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def main(argv: list[str]) -> int:
    from harness.report import hardware_line, plot_throughput

    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    for name in argv:
        path = Path(name)
        record = json.loads(path.read_text())
        title = f"{record.get('benchmark', path.stem)}, {record['model']['dir_name']}, {hardware_line(record['hardware'])}"
        print(plot_throughput(record["rows"], path.with_suffix(".png"), title))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
