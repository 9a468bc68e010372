"""Sampled tree builders (tree/sampled.py): shapes by draws, draw order kept, budget cuts a
prefix of every node's draws, and the DynaTree variant keeps (never expands) drawn children
below tau; lockstep passes children in the given order only when asked."""
from __future__ import annotations

import numpy as np
import pytest

from vllm_treespec.tree import BuildError
from vllm_treespec.tree.lockstep import builder_steps, run_lockstep
from vllm_treespec.tree.sampled import sampled_steps


def _draws(requests):
    """Deterministic 'draws' NOT sorted by probability: token = 10*depth + rank, log q rising."""
    out = []
    for _, paths, k in requests:
        toks = np.array([[10 * (len(p) + 1) + r for r in range(k)] for p in paths])
        lps = np.log(np.tile(np.linspace(0.1, 0.3, k), (len(paths), 1)))
        out.append((toks, lps))
    return out


def _build(builder, budget, **params):
    return run_lockstep([sampled_steps(builder, 1, budget, **params)], _draws, ordered=True)[0]


def test_static_keeps_draw_order_and_template_shape():
    tree = _build("static", 64, template=(3, 2))
    assert tree.draft_token_ids() == [10, 11, 12] + [20, 21] * 3
    assert tree.parents.tolist() == [-1, 0, 0, 0, 1, 1, 2, 2, 3, 3]


def test_budget_cut_is_a_breadth_first_prefix():
    full = _build("static", 64, template=(3, 2, 2))
    for n in range(0, full.num_draft + 1):
        assert _build("static", n, template=(3, 2, 2)).draft_token_ids() == full.prefix(n).draft_token_ids()


def test_chain_is_one_draw_per_level():
    tree = _build("chain", 64, max_depth=5)
    assert tree.draft_token_ids() == [10, 20, 30, 40, 50]
    assert tree.parents.tolist() == [-1, 0, 1, 2, 3, 4]


def test_threshold_keeps_low_draws_but_does_not_expand_them():
    # q of rank 0 = 0.1, rank 1 = 0.3: with tau 0.2 only the rank-1 child (0.3) is expanded at
    # depth 1; both of its draws (0.03, 0.09) fall below tau, are kept, and end the tree.
    tree = _build("threshold", 64, branch=2, max_depth=3, tau=0.2)
    assert tree.draft_token_ids() == [10, 11, 20, 21]
    assert tree.parents.tolist() == [-1, 0, 0, 2, 2]


def test_unsorted_children_reach_builders_sorted_unless_ordered():
    gen = lambda: [builder_steps("static", 1, 8, template=(3,))]
    assert run_lockstep(gen(), _draws)[0].draft_token_ids() == [12, 11, 10]
    assert run_lockstep(gen(), _draws, ordered=True)[0].draft_token_ids() == [10, 11, 12]


@pytest.mark.parametrize("builder,params,match", [
    ("best_first", {}, "cannot build sampled trees"),
    ("static", {"tau": 0.1}, "unknown parameter"),
    ("static", {"template": [0]}, "template"),
    ("threshold", {"tau": 0.0}, "tau"),
    ("chain", {"max_depth": -1}, "max_depth"),
])
def test_bad_parameters_name_the_parameter(builder, params, match):
    with pytest.raises(BuildError, match=match):
        sampled_steps(builder, 1, 8, **params)
