"""The n-gram trie drafter: batched greedy chains, tree expansion with the builders, config checks."""
from __future__ import annotations

import numpy as np
import pytest

from vllm_treespec.config import ConfigError, NgramTrieConfig, load_config
from vllm_treespec.drafters import DraftInputs, make_drafter
from vllm_treespec.tree import build_tree

STREAMS = [[1, 2, 3, 4, 5, 1, 2, 3, 4, 6], [7, 1, 2, 3, 4, 5, 9], [2, 3, 8]]


@pytest.fixture(scope="module")
def trie_path(tmp_path_factory):
    from vllm_treespec.ngram import build_trie_from_streams

    out = tmp_path_factory.mktemp("trie") / "t.trie"
    build_trie_from_streams(STREAMS, out, order=3)
    return out


def _drafter(path, **kw):
    cfg = NgramTrieConfig(type="ngram_trie", path=str(path), **kw)
    return make_drafter(cfg, tokenizer_dir=None)


def test_chains_follow_most_frequent_continuations(trie_path):
    d = _drafter(trie_path, order=3)
    buf = np.zeros((4, 16), dtype=np.int32)
    buf[0, :3] = [9, 1, 2]      # context (1, 2): 3 always follows, then (2,3)->4, (3,4)->5
    buf[2, :2] = [0, 0]         # unseen context: no draft
    inputs = DraftInputs(req_ids=["a", "b"], token_ids=buf, rows=np.array([0, 2]),
                         num_tokens=np.array([3, 2]), budgets=np.array([3, 5]))
    assert d.propose_chains(inputs) == [[3, 4, 5], []]
    inputs.budgets = np.array([0, 5])
    assert d.propose_chains(inputs) == [[], []]
    # min_context=0 allows unigram backoff for unseen contexts
    d0 = _drafter(trie_path, min_context=0)
    inputs.budgets = np.array([1, 1])
    assert d0.propose_chains(inputs)[1] != []


def test_expander_feeds_every_builder(trie_path):
    d = _drafter(trie_path)
    for builder, params in [("chain", {}), ("best_first", {}), ("static", {"template": (2, 1)}),
                            ("threshold", {"tau": 0.01, "branch": 2, "max_depth": 3}),
                            ("beam", {"width": 2, "topk": 2, "max_depth": 3})]:
        tree = build_tree(builder, d.expander(context=[9, 1], root=2), budget=4, **params)
        assert 1 <= len(tree.draft_token_ids()) <= 4, builder
        assert tree.tokens[1] == 3  # the only continuation of (1, 2)


def test_wrong_order_and_missing_file_fail_with_the_key(trie_path, tmp_path):
    with pytest.raises(ConfigError, match=r"drafter.order: 4 .*order 3"):
        _drafter(trie_path, order=4)
    with pytest.raises(ConfigError, match=r"drafter.path: trie file .*missing.trie does not exist"):
        _drafter(tmp_path / "missing.trie")
    with pytest.raises(ConfigError, match=r"drafter.path: .*unknown trie fixture"):
        _drafter("fixture:nope")
    bad = tmp_path / "bad.trie"
    bad.write_bytes(b"not a trie at all" * 10)
    with pytest.raises(ConfigError, match="drafter.path"):
        _drafter(bad)


def test_tokenizer_mismatch_fails_startup(tmp_path, tiny_model):
    from vllm_treespec.ngram import build_trie_from_streams

    foreign = tmp_path / "foreign.trie"
    build_trie_from_streams(STREAMS, foreign, order=3, fingerprint="ab" * 32)
    cfg = NgramTrieConfig(type="ngram_trie", path=str(foreign))
    with pytest.raises(ConfigError, match=r"drafter.path:.*tokenizer"):
        make_drafter(cfg, tokenizer_dir=str(tiny_model))


def test_online_layer_learns_served_outputs(trie_path):
    d = _drafter(trie_path, online_mb=1)
    buf = np.zeros((1, 8), dtype=np.int32)
    buf[0, :2] = [9, 8]       # 8 ends its stream: no continuation yet
    inputs = DraftInputs(req_ids=["a"], token_ids=buf, rows=np.array([0]), num_tokens=np.array([2]),
                         budgets=np.array([2]))
    assert d.propose_chains(inputs) == [[]]
    for _ in range(3):
        d.observe_output(np.array([9, 8, 6, 7], dtype=np.int32))
    assert d.propose_chains(inputs) == [[6, 7]]


def test_preset_is_valid():
    cfg = load_config("demo/ngram-trie", 8)
    assert cfg.drafter.type == "ngram_trie" and cfg.drafter.path == "fixture:stdlib-3gram"


def test_trie_is_a_rho_signal_for_presto_and_dart_scoring(trie_path):
    from vllm_treespec.drafters.ngram_trie import TrieSignal
    from vllm_treespec.ngram import NgramTrie
    from vllm_treespec.tree import DepthTable, as_ngram_signal

    trie = NgramTrie.load(trie_path)
    rho = as_ngram_signal(TrieSignal(trie))
    lp = rho.logprobs([7, 1, 2], np.array([3, 0]))  # 0 never occurs: floor
    assert lp[0] == pytest.approx(0.0) and lp[1] == pytest.approx(np.log(1e-10))  # (1,2)->3 always
    # a prefix-blind table whose top-1 at depth 2 contradicts the trie: n-gram scoring reorders it
    table = DepthTable(tokens=[[3, 6], [6, 4]], logprobs=np.log([[.9, .05], [.55, .45]]), root=2,
                       context=(1,), rho=rho)
    plain = build_tree("beam", table, budget=2, width=1, topk=2)
    presto = build_tree("beam", table, budget=2, width=1, topk=2, scorer="presto")
    assert plain.draft_token_ids() == [3, 6] and presto.draft_token_ids() == [3, 4]


@pytest.mark.parametrize("tree", [
    {"builder": "chain"},
    {"builder": "best_first", "topk": 2, "max_depth": 4},
    {"builder": "beam", "topk": 2, "width": 2, "max_depth": 4, "scorer": "dart"},
    {"builder": "threshold", "branch": 2, "max_depth": 4, "tau": 0.01},
])
def test_propose_returns_trees_within_budget(trie_path, tree):
    from vllm_treespec.config import parse_config

    cfg = parse_config({"drafter": {"type": "ngram_trie", "path": str(trie_path)}, "tree": tree})
    d = make_drafter(cfg.drafter, tokenizer_dir=None, tree_config=cfg.tree)
    buf = np.zeros((3, 16), dtype=np.int32)
    buf[0, :3] = [9, 1, 2]
    buf[1, :2] = [0, 0]
    buf[2, :4] = [5, 1, 2, 3]
    inputs = DraftInputs(req_ids=["a", "b", "c"], token_ids=buf, rows=np.arange(3),
                         num_tokens=np.array([3, 2, 4]), budgets=np.array([6, 6, 0]))
    trees = d.propose(inputs).trees
    assert [t.root for t in trees] == [2, 0, 3]                  # rooted at each last token
    assert trees[0].num_draft >= 1 and trees[0].draft_token_ids()[0] == 3
    assert trees[1].num_draft == 0 and trees[2].num_draft == 0   # unseen context; budget 0
    for t, b in zip(trees, inputs.budgets):
        assert t.num_draft <= b
        t.validate()


def test_native_best_first_equals_the_expander_tree(trie_path):
    """best_first + acc_logp drafts with the C++ core; it builds the tree the Python builder
    builds over the same trie continuations (children capped at drafter.k)."""
    from vllm_treespec.config import parse_config

    buf = np.zeros((5, 16), dtype=np.int32)
    contexts = [[9, 1, 2], [1, 2, 3], [5, 1], [2, 3, 4, 5], [7, 1, 2, 3]]
    for r, c in enumerate(contexts):
        buf[r, :len(c)] = c
    lens = np.array([len(c) for c in contexts])
    for k, topk, depth in [(4, None, 6), (2, 4, 5), (3, 2, 3)]:
        tree = {"builder": "best_first", "max_depth": depth, **({"topk": topk} if topk else {})}
        cfg = parse_config({"drafter": {"type": "ngram_trie", "path": str(trie_path), "k": k}, "tree": tree})
        d = make_drafter(cfg.drafter, tokenizer_dir=None, tree_config=cfg.tree)
        assert d.native
        inputs = DraftInputs(req_ids=list("abcde"), token_ids=buf, rows=np.arange(5), num_tokens=lens,
                             budgets=np.array([1, 5, 9, 12, 20]))
        for i, got in enumerate(d.propose(inputs).trees):
            context = buf[i, :lens[i]]
            want = build_tree("best_first", d.expander(context[:-1][-d.context_len:], int(context[-1])),
                              int(inputs.budgets[i]), topk=min(k, topk or k), max_depth=depth)
            assert got.draft_token_ids() == want.draft_token_ids()
            assert np.array_equal(got.parents, want.parents)
            np.testing.assert_allclose(got.score, want.score, rtol=0, atol=1e-6)   # float32 there


@pytest.mark.parametrize("min_context,max_depth", [(1, None), (0, 3), (2, None)])
def test_native_chains_equal_the_python_chains(trie_path, min_context, max_depth):
    from vllm_treespec.config import parse_config

    tree = {"builder": "chain", **({"max_depth": max_depth} if max_depth else {})}
    cfg = parse_config({"drafter": {"type": "ngram_trie", "path": str(trie_path), "min_context": min_context},
                        "tree": tree})
    d = make_drafter(cfg.drafter, tokenizer_dir=None, tree_config=cfg.tree)
    assert d.native
    rng = np.random.default_rng(min_context)
    buf = rng.integers(0, 10, size=(6, 12)).astype(np.int32)
    buf[0, :3] = [7, 1, 2]
    inputs = DraftInputs(req_ids=list("abcdef"), token_ids=buf, rows=np.arange(6),
                         num_tokens=np.array([3, 12, 5, 1, 8, 9]), budgets=np.array([9, 4, 0, 6, 2, 12]))
    trees = d.propose(inputs).trees
    assert [t.draft_token_ids() for t in trees] == d.propose_chains(inputs)
    assert trees[0].draft_token_ids()[:3] == [3, 4, 5][:len(trees[0].draft_token_ids())]


def test_capabilities_are_declared_not_probed(trie_path):
    """The proposer reads `capabilities`: only a trie with an online layer observes outputs;
    the base class refuses an output a drafter did not ask for."""
    from vllm_treespec.drafters import Drafter, DrafterCapabilities

    assert _drafter(trie_path, online_mb=1).capabilities == DrafterCapabilities(observes_output=True)
    offline = _drafter(trie_path)
    assert offline.capabilities == DrafterCapabilities() and isinstance(offline, Drafter)
    with pytest.raises(NotImplementedError, match="observes_output"):
        Drafter.observe_output(offline, np.array([1], dtype=np.int32))
