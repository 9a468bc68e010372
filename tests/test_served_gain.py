"""benchmarks/served_gain.py: the treespec_gain_* lines of /metrics, the model label dropped."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))

import served_gain  # noqa: E402

TEXT = """# HELP treespec_gain_decisions_total x
treespec_gain_decisions_total{decision="stopped",model_name="m"} 12.0
treespec_gain_decisions_total{decision="draft",model_name="m"} 3.0
treespec_gain_cost_tokens{model_name="m",part="row"} 0.05
treespec_tree_nodes_sum{model_name="m"} 40.0
vllm:spec_decode_num_drafts_total{model_name="m"} 9.0
"""


def test_parse_keeps_our_series_and_their_labels():
    got = served_gain.parse_series(TEXT)
    assert got == {"treespec_gain_decisions_total{decision=stopped}": 12.0,
                   "treespec_gain_decisions_total{decision=draft}": 3.0,
                   "treespec_gain_cost_tokens{part=row}": 0.05,
                   "treespec_tree_nodes_sum": 40.0}
