"""Per-step tree overrides (a budget.table rule's max_depth and builder keys, handed to drafters as
DraftInputs.tree_overrides): a drafter given overrides drafts exactly the trees it drafts when the
tree section itself says so, for every drafter without a model (the model drafters' tests are
beside them: test_draft_model_drafter.py, test_head_drafter.py)."""
from __future__ import annotations

import numpy as np
import pytest

from vllm_treespec.config import parse_config
from vllm_treespec.drafters import DraftInputs, make_drafter

STREAMS = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 6, 7, 8, 9, 1, 2, 3, 4, 5, 6, 7],
           [7, 1, 2, 3, 4, 5, 9, 1, 2, 3, 8, 2, 3, 4, 5, 6], [2, 3, 8, 9, 1, 2, 3, 4]]


@pytest.fixture(scope="module")
def trie_path(tmp_path_factory):
    from vllm_treespec.ngram import build_trie_from_streams

    out = tmp_path_factory.mktemp("trie") / "t.trie"
    build_trie_from_streams(STREAMS, out, order=3)
    return out


def _inputs(overrides=None):
    rows = [STREAMS[0] + [1, 2], STREAMS[1] + [2, 3], [5, 1, 2]]
    buf = np.zeros((len(rows), 40), dtype=np.int32)
    for i, r in enumerate(rows):
        buf[i, :len(r)] = r
    return DraftInputs(req_ids=[f"r{i}" for i in range(len(rows))], token_ids=buf, rows=np.arange(len(rows)),
                       num_tokens=np.array([len(r) for r in rows]), budgets=np.array([12, 12, 12]),
                       tree_overrides=overrides or {})


def _trees(drafter_cfg, tree, overrides=None):
    cfg = parse_config({"drafter": drafter_cfg, "tree": tree})
    return make_drafter(cfg.drafter, None, cfg.tree).propose(_inputs(overrides)).trees


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.tokens.tolist() == y.tokens.tolist() and x.parents.tolist() == y.parents.tolist()


CASES = [  # (drafter, tree section, overrides): overrides on the tree section == the merged section
    ({"type": "prompt_lookup", "max_matches": 4}, {"builder": "best_first", "max_depth": 8}, {"max_depth": 2}),
    ({"type": "prompt_lookup"}, {"builder": "chain"}, {"max_depth": 3}),
    ({"type": "lookup_trie", "path": "fixture:stdlib-3gram", "k": 3}, {"builder": "best_first", "max_depth": 8}, {"max_depth": 2}),
    ({"type": "ngram_trie", "path": "fixture:stdlib-3gram", "k": 3}, {"builder": "best_first", "max_depth": 8}, {"max_depth": 2, "topk": 1}),
    ({"type": "ngram_trie", "path": "fixture:stdlib-3gram", "k": 3}, {"builder": "chain"}, {"max_depth": 2}),
    ({"type": "ngram_trie", "path": "fixture:stdlib-3gram", "k": 3}, {"builder": "beam", "max_depth": 6, "width": 4}, {"width": 1, "max_depth": 3}),
    ({"type": "ngram_trie", "path": "fixture:stdlib-3gram", "k": 3}, {"builder": "threshold", "branch": 3, "tau": 0.01}, {"branch": 1, "tau": 0.2}),
    ({"type": "ngram_trie", "path": "fixture:stdlib-3gram", "k": 3}, {"builder": "static", "template": [3, 2, 1]}, {"template": [1, 1]}),
]


@pytest.mark.parametrize("drafter, tree, overrides", CASES, ids=lambda v: str(v)[:40])
def test_overrides_draft_what_the_overridden_section_drafts(trie_path, drafter, tree, overrides):
    if drafter["type"] != "prompt_lookup":
        drafter = {**drafter, "path": str(trie_path)}
    overridden = _trees(drafter, tree, overrides)
    _same(overridden, _trees(drafter, {**tree, **overrides}))
    plain = _trees(drafter, tree)
    assert any(a.tokens.tolist() != b.tokens.tolist() for a, b in zip(plain, overridden)), \
        "the case does not exercise the override"
    if "max_depth" in overrides:
        assert max(int(t.depth.max()) for t in overridden) <= overrides["max_depth"]

