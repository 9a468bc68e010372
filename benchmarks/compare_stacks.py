"""Two py-spy raw profiles side by side, every function's inclusive samples as a share of the
target model's forward (`GPUModelRunner._model_forward`) in the same profile.

Why the forward: both runs do the same forward work per step (one row per request in a plain
step), so dividing by it cancels the VM's speed drift between the two runs, which moves
absolute sample counts by tens of percent. What is left is each config's own per-step work.

    /tmp/pyspy/bin/py-spy record --nonblocking -r 200 -f raw -o /tmp/off.txt -- \\
        .venv/bin/python benchmarks/profile_offline.py off 24 --temperature 0.7 --unseeded --no-profile
    /tmp/pyspy/bin/py-spy record --nonblocking -r 200 -f raw -o /tmp/default.txt -- \\
        .venv/bin/python benchmarks/profile_offline.py lookup-online 24 --temperature 0.7 --unseeded --no-profile
    .venv/bin/python benchmarks/compare_stacks.py /tmp/off.txt /tmp/default.txt --labels off default \\
        --match 'EngineCore.step|sample_tokens|propose|TreeProposer|BudgetControl|GainControl|StepCost'

(`--nonblocking`: py-spy's default pauses the process for every sample, which at 200 Hz slowed
these runs tenfold.) Prints a markdown table, largest difference first.
"""
from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

from profile_serving import inclusive_counts

FORWARD = "GPUModelRunner._model_forward"


def inclusive_samples(path: Path) -> Counter:
    """Samples per function ('func (file.py)'), each counted once per stack it appears in
    (py-spy `-f raw`; profile_serving.inclusive_counts reads it)."""
    return inclusive_counts(path.read_text())[0]


def forward_samples(counts: Counter, path: Path) -> int:
    total = sum(v for k, v in counts.items() if k.startswith(FORWARD + " "))
    if total == 0:
        raise SystemExit(f"{path}: no {FORWARD} samples (not a vLLM engine profile?)")
    return total


def compare(a: Counter, b: Counter, fa: int, fb: int, match: str | None, min_diff: float) -> list[tuple[float, float, float, str]]:
    """(difference, share in a, share in b, function) in percent of each profile's forward."""
    pattern = re.compile(match) if match else None
    rows = []
    for name in set(a) | set(b):
        if pattern is not None and not pattern.search(name):
            continue
        sa, sb = 100.0 * a.get(name, 0) / fa, 100.0 * b.get(name, 0) / fb
        if abs(sb - sa) >= min_diff:
            rows.append((sb - sa, sa, sb, name))
    return sorted(rows, reverse=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", type=Path)
    p.add_argument("b", type=Path)
    p.add_argument("--labels", nargs=2, default=("a", "b"))
    p.add_argument("--match", default=None, help="only functions whose name matches this regex")
    p.add_argument("--min-diff", type=float, default=0.1, help="hide rows closer than this (percent)")
    ns = p.parse_args(argv)
    a, b = inclusive_samples(ns.a), inclusive_samples(ns.b)
    fa, fb = forward_samples(a, ns.a), forward_samples(b, ns.b)
    la, lb = ns.labels
    print(f"inclusive samples as % of the model forward ({la}: {fa} forward samples, {lb}: {fb})\n")
    print(f"| function | {la} | {lb} | {lb} - {la} |")
    print("| --- | --- | --- | --- |")
    for diff, sa, sb, name in compare(a, b, fa, fb, ns.match, ns.min_diff):
        print(f"| `{name}` | {sa:.2f} | {sb:.2f} | {diff:+.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
