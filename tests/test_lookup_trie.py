"""Lookup-trie trees: the C++ core equals the Python reference, trees are prefix-closed, and the
config section fails clearly on wrong values."""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path

import numpy as np
import pytest

from support.lookup_trie_reference import lookup_trie_trees_reference
from vllm_treespec.config import ConfigError, load_config
from vllm_treespec.drafters import DraftInputs, make_drafter
from vllm_treespec.ngram import NgramTrie, build_trie_from_streams
from vllm_treespec.tree import DraftTree


def same(a: DraftTree, b: DraftTree) -> None:
    for f in ("tokens", "parents", "depth", "logprob", "score", "source"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), (f, getattr(a, f), getattr(b, f))


def native_trees(trie: NgramTrie, buf, rows, lens, budgets, **p) -> list[DraftTree]:
    tokens, parents, depth, logprob, score, counts, source = trie._t.lookup_trie_trees(
        buf, np.asarray(rows, np.int64), np.asarray(lens, np.int64), np.asarray(budgets, np.int64), **p)
    out, start = [], 0
    for end in np.cumsum(counts + 1).tolist():
        out.append(DraftTree(tokens[start:end], parents[start:end], depth[start:end],
                             logprob[start:end], score[start:end], source=source[start:end]))   # validates
        start = end
    return out


def random_case(rng: np.random.Generator, vocab: int):
    """A token buffer with repeats (so suffixes match) and random mixture parameters."""
    rows, width = int(rng.integers(1, 5)), 80
    motif = rng.integers(vocab, size=int(rng.integers(2, 8)))
    buf = np.zeros((rows, width), np.int32)
    for r in range(rows):
        seq = np.concatenate([motif if rng.random() < 0.6 else rng.integers(vocab, size=5)
                              for _ in range(40)])[:width]
        buf[r] = np.where(rng.random(width) < 0.15, rng.integers(vocab, size=width), seq)
    lens = rng.integers(1, width + 1, size=rows)
    budgets = rng.integers(0, 30, size=rows)
    params = dict(min_ngram=int(rng.integers(1, 3)), max_ngram=int(rng.integers(3, 6)),
                  max_matches=int(rng.integers(0, 9)), max_depth=int(rng.integers(1, 12)),
                  k=int(rng.integers(1, 7)), min_context=int(rng.integers(0, 3)),
                  lookup_weight=float(rng.choice([0.0, 0.3, 0.8, 1.0])), chain=bool(rng.integers(2)),
                  min_path_prob=float(rng.choice([0.0, 0.0, 0.01, 0.1, 0.5])))
    return buf, np.arange(rows), lens, budgets, params


@pytest.mark.parametrize("seed", range(40))
def test_native_trees_equal_the_reference(seed):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(3, 20))
    streams = [rng.integers(vocab, size=int(rng.integers(5, 120))).tolist() for _ in range(5)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.trie"
        build_trie_from_streams(streams, path, order=int(rng.integers(1, 5)), vocab_size=vocab)
        trie = NgramTrie.load(path)
        if seed % 4 == 0:   # an online layer that has seen other text shifts the probabilities
            trie.enable_online(capacity_mb=1)
            trie.observe(rng.integers(vocab, size=200).astype(np.int32))
        buf, rows, lens, budgets, params = random_case(rng, vocab)
        got = native_trees(trie, buf, rows, lens, budgets, **params)
        want = lookup_trie_trees_reference(buf, rows, lens, budgets, trie, **params)
        for a, b, budget in zip(got, want, budgets):
            same(a, b)
            assert a.num_draft <= budget
            assert (a.depth[1:] <= params["max_depth"]).all()


@contextlib.contextmanager
def random_trie_case(rng: np.random.Generator, vocab: int = 12):
    """(trie, buf, rows, lens, params): an order-3 trie of random streams and a random batch."""
    streams = [rng.integers(vocab, size=100).tolist() for _ in range(4)]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.trie"
        build_trie_from_streams(streams, path, order=3, vocab_size=vocab)
        buf, rows, lens, _, params = random_case(rng, vocab)
        yield NgramTrie.load(path), buf, rows, lens, params


@pytest.mark.parametrize("seed", range(6))
def test_memoised_trie_answers_equal_fresh_ones(seed):
    """Later calls answer repeated contexts from the trie's topk memo (csrc/ngram/topk_memo.h):
    still the reference's trees, for any k (k is part of the memo key)."""
    rng = np.random.default_rng(100 + seed)
    with random_trie_case(rng) as (trie, buf, rows, lens, params):
        budgets = np.full(len(rows), 20)
        for k in (params["k"], params["k"] + 2, params["k"]):
            p = {**params, "k": k}
            want = lookup_trie_trees_reference(buf, rows, lens, budgets, trie, **p)
            for _ in range(2):
                for a, b in zip(native_trees(trie, buf, rows, lens, budgets, **p), want):
                    same(a, b)
        stats = trie._t.topk_memo_stats()
        assert stats["hits"] > 0 and 0 < stats["entries"] <= stats["misses"]


def test_a_trie_learning_online_is_never_answered_from_the_memo():
    """Online counts move between calls, so the memo would go stale: it is bypassed."""
    rng = np.random.default_rng(7)
    with random_trie_case(rng) as (trie, buf, rows, lens, params):
        trie.enable_online(capacity_mb=1)
        budgets = np.full(len(rows), 20)
        for _ in range(2):
            want = lookup_trie_trees_reference(buf, rows, lens, budgets, trie, **params)
            for a, b in zip(native_trees(trie, buf, rows, lens, budgets, **params), want):
                same(a, b)
            trie.observe(rng.integers(12, size=200).astype(np.int32))
        assert trie._t.topk_memo_stats() == {"hits": 0, "misses": 0, "entries": 0}


@pytest.mark.parametrize("seed", range(10))
def test_trees_are_prefix_closed(seed):
    """vLLM may cut a request's drafts to a prefix: that prefix is the tree for that budget."""
    with random_trie_case(np.random.default_rng(100 + seed)) as (trie, buf, rows, lens, params):
        params["chain"] = False
        big = native_trees(trie, buf, rows, lens, [40] * len(rows), **params)
        for n in range(0, 41, 7):
            for tree, full in zip(native_trees(trie, buf, rows, lens, [n] * len(rows), **params), big):
                same(tree, full.prefix(min(n, full.num_draft)))


@pytest.mark.parametrize("seed", range(6))
def test_min_path_prob_cuts_the_unfloored_tree_where_its_paths_get_unlikely(seed):
    """The floor only stops early: the floored tree is a prefix of the unfloored one, every
    node's path probability is at least the floor and the next node's (if any) is below it."""
    with random_trie_case(np.random.default_rng(200 + seed)) as (trie, buf, rows, lens, params):
        params["chain"] = bool(seed % 2)
        params["min_path_prob"] = 0.0
        full = native_trees(trie, buf, rows, lens, [30] * len(rows), **params)
        for floor in (0.02, 0.2, 0.6):
            cut = native_trees(trie, buf, rows, lens, [30] * len(rows), **{**params, "min_path_prob": floor})
            for c, f in zip(cut, full):
                same(c, f.prefix(c.num_draft))
                log_floor = np.log(floor)            # scores are stored as float32
                assert (c.score[1:] >= log_floor - 1e-6).all()
                if c.num_draft < f.num_draft:
                    assert f.score[c.num_draft + 1] < log_floor + 1e-6


def test_min_path_prob_is_range_checked():
    with pytest.raises(ConfigError, match=r"drafter.min_path_prob: 1.0 is out of range"):
        load_config({"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram", "min_path_prob": 1.0}}, 16)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.trie"
        build_trie_from_streams([[1, 2, 3, 4] * 5], path, order=2, vocab_size=8)
        trie = NgramTrie.load(path)
        kw = dict(min_ngram=1, max_ngram=2, max_matches=2, max_depth=3, k=2, min_context=1,
                  lookup_weight=0.5, chain=False)
        with pytest.raises(ValueError, match="min_path_prob"):
            native_trees(trie, np.zeros((1, 8), np.int32), [0], [4], [3], **kw, min_path_prob=-0.1)


def test_lookup_weight_one_follows_the_match_and_zero_is_the_trie_alone():
    vocab = 10
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.trie"
        build_trie_from_streams([[1, 2, 3, 4] * 10], path, order=2, vocab_size=vocab)
        trie = NgramTrie.load(path)
        # the request repeated "5 1 7 8" earlier: lookup says 1 -> 7 -> 8, the trie says 1 -> 2 -> 3
        buf = np.array([[5, 1, 7, 8, 9, 5, 1]], np.int32)
        kw = dict(min_ngram=1, max_ngram=3, max_matches=4, max_depth=3, k=2, min_context=1, chain=True)
        lookup = native_trees(trie, buf, [0], [7], [3], lookup_weight=1.0, **kw)[0]
        trie_only = native_trees(trie, buf, [0], [7], [3], lookup_weight=0.0, **kw)[0]
        assert lookup.draft_token_ids() == [7, 8, 9]
        assert trie_only.draft_token_ids() == [2, 3, 4]
        # each node says what rated it (DraftTree.source), so the engine calibrates the two apart
        assert lookup.source.tolist() == [0, 0, 0, 0] and trie_only.source.tolist() == [0, 1, 1, 1]


def test_sampled_requests_draft_from_the_sampled_trie():
    """drafter.sampled_path: requests with temperature > 0 draft from the second trie, greedy and
    unknown ones from `path`, in the batch's order, whichever mix the step holds."""
    from types import SimpleNamespace

    from vllm_treespec.drafters.lookup_trie import LookupTrieDrafter

    vocab = 10
    with tempfile.TemporaryDirectory() as tmp:
        greedy, sampled = Path(tmp) / "greedy.trie", Path(tmp) / "sampled.trie"
        build_trie_from_streams([[1, 2, 3, 4] * 10], greedy, order=2, vocab_size=vocab)
        build_trie_from_streams([[1, 5, 6, 7] * 10], sampled, order=2, vocab_size=vocab)
        cfg = load_config({"drafter": {"type": "lookup_trie", "path": str(greedy),
                                       "sampled_path": str(sampled), "lookup_weight": 0.0},
                           "tree": {"builder": "chain", "max_depth": 3}}, 8)
        drafter = LookupTrieDrafter(cfg.drafter, None, cfg.tree)
        assert drafter.capabilities.reads_sampling
        buf = np.array([[9, 8, 1]] * 3, np.int32)

        def drafts(temperatures):
            sampling = (None if temperatures is None else
                        [None if t is None else SimpleNamespace(temperature=t) for t in temperatures])
            inputs = DraftInputs(req_ids=["a", "b", "c"], token_ids=buf, rows=np.arange(3),
                                 num_tokens=np.array([3, 3, 3]), budgets=np.array([3, 3, 3]),
                                 sampling=sampling)
            return [t.draft_token_ids() for t in drafter.propose(inputs).trees]

        g, s_ = [2, 3, 4], [5, 6, 7]
        assert drafts([0.7, None, 0.0]) == [s_, g, g]
        assert drafts([0.0, 1.0, 0.3]) == [g, s_, s_]
        assert drafts([0.7, 0.7, 1.0]) == [s_, s_, s_]
        assert drafts([1e-6, 1e-5, None]) == [g, s_, g]      # vLLM's greedy threshold, 1e-5
        assert drafts(None) == [g, g, g]
        missing = load_config({"drafter": {"type": "lookup_trie", "path": str(greedy),
                                           "sampled_path": str(Path(tmp) / "nope.trie")}}, 8)
        with pytest.raises(ConfigError, match="drafter.sampled_path: trie file .* does not exist"):
            LookupTrieDrafter(missing.drafter, None, missing.tree)


def test_drafter_from_config_on_the_fixture_trie(tiny_model):
    cfg = load_config({"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram"}, "tree": {"builder": "best_first", "max_depth": 6}}, 16)
    drafter = make_drafter(cfg.drafter, str(tiny_model), cfg.tree)
    buf = np.tile(np.arange(40, 60, dtype=np.int32), (2, 4))
    inputs = DraftInputs(req_ids=["a", "b"], token_ids=buf, rows=np.arange(2), num_tokens=np.array([70, 33]),
                         budgets=np.array([16, 0]))
    trees = drafter.propose(inputs).trees
    assert trees[0].num_draft == 16 and trees[1].num_draft == 0
    assert trees[0].draft_token_ids()[0] == 50          # the repeated sequence continues
    assert trees[0].tokens[0] == buf[0, 69] and trees[1].tokens[0] == buf[1, 32]


@pytest.mark.parametrize("raw, message", [
    ({"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram", "lookup_weight": 1.5}}, "drafter.lookup_weight: 1.5 is out of range"),
    ({"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram", "min_ngram": 4, "max_ngram": 2}}, "drafter.min_ngram: 4 is larger"),
    ({"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram"}, "tree": {"builder": "beam"}}, "tree.builder: 'beam' cannot shape lookup_trie"),
    ({"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram"}, "tree": {"builder": "best_first", "topk": 4}},
     "lookup_trie ranks tree nodes by mixture probabilities"),
    ({"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram", "max_matches": -1}}, "drafter.max_matches"),
    ({"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram", "recent_max_ngram": 16}},
     "drafter.recent_max_ngram: 16 needs outputs to search; set drafter.online_mb > 0"),
    ({"drafter": {"type": "lookup_trie", "path": None, "online_mb": 1, "recent_max_ngram": 16, "recent_mb": 0}},
     "drafter.recent_mb: 0.0 leaves no room"),
    ({"drafter": {"type": "lookup_trie", "path": None, "online_mb": 1, "recent_max_ngram": 65}}, "drafter.recent_max_ngram"),
    ({"drafter": {"type": "lookup_trie", "path": None, "online_mb": 1, "depth_per_match": -1}},
     "drafter.depth_per_match: -1.0 is out of range"),
])
def test_config_errors_name_the_key(raw, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(raw, 16)


def test_native_call_rejects_bad_batches_without_copying():
    """The engine buffer is read in place: a wrong dtype is refused (never silently copied), and
    rows, lengths and budgets are checked like the lookup trees' (shared C++ check)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.trie"
        build_trie_from_streams([[1, 2, 3, 4] * 5], path, order=2, vocab_size=8)
        trie = NgramTrie.load(path)
        buf = np.zeros((2, 8), np.int32)
        kw = dict(min_ngram=1, max_ngram=2, max_matches=2, max_depth=3, k=2, min_context=1,
                  lookup_weight=0.5, chain=False)
        with pytest.raises(TypeError):
            native_trees(trie, buf.astype(np.int64), [0], [4], [3], **kw)
        with pytest.raises(IndexError, match="row 2 is out of range"):
            native_trees(trie, buf, [2], [4], [3], **kw)
        with pytest.raises(IndexError, match="length 9 is out of range"):
            native_trees(trie, buf, [0], [9], [3], **kw)
        with pytest.raises(ValueError, match="budget -1 is negative"):
            native_trees(trie, buf, [0], [4], [-1], **kw)
        with pytest.raises(ValueError, match="lookup_weight"):
            native_trees(trie, buf, [0], [4], [3], **{**kw, "lookup_weight": 1.5})


def test_an_online_only_trie_drafts_what_this_deployment_served():
    """drafter.path null with online_mb: no corpus, no file left behind; the trie drafts nothing
    until a finished request's output teaches it, then continues that output from a short
    context (the request's own text has no earlier match: prompt lookup alone drafts nothing)."""
    import glob
    import os

    cfg = load_config({"drafter": {"type": "lookup_trie", "path": None, "online_mb": 1,
                                   "min_context": 2},
                       "tree": {"builder": "chain", "max_depth": 4}}, 8)
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "treespec-online-trie-*")))
    drafter = make_drafter(cfg.drafter, None, cfg.tree, vocab_limit=64)
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "treespec-online-trie-*"))) == before
    assert drafter.capabilities.observes_output and drafter.trie.num_nodes == 1
    assert drafter.seeded_trie.online_stats() is None
    buf = np.array([[3, 4, 5, 6, 7, 8]], np.int32)
    inputs = DraftInputs(req_ids=["a"], token_ids=buf, rows=np.arange(1), num_tokens=np.array([6]),
                         budgets=np.array([8]))
    assert drafter.propose(inputs).trees[0].draft_token_ids() == []
    drafter.observe_output(np.array([20, 7, 8, 9, 10, 11, 12, 13], np.int32))
    assert drafter.propose(inputs).trees[0].draft_token_ids() == [9, 10, 11, 12]
    with pytest.raises(ValueError, match="vocab size"):
        make_drafter(cfg.drafter, None, cfg.tree)


def test_a_lookup_trie_without_a_file_or_online_layer_says_what_to_set():
    with pytest.raises(ConfigError) as e:
        load_config({"drafter": {"type": "lookup_trie", "path": None}}, 8)
    assert "drafter.path: required key is missing" in str(e.value)
    assert "drafter.online_mb > 0" in str(e.value)
    with pytest.raises(ConfigError, match=r"drafter.order: 12 is too long .*allowed 1..8"):
        load_config({"drafter": {"type": "lookup_trie", "path": None, "online_mb": 1, "order": 12}}, 8)
    assert load_config({"drafter": {"type": "lookup_trie", "path": None, "online_mb": 1, "order": 8}},
                       8).drafter.order == 8


def test_seeded_sampled_requests_draft_without_what_other_requests_taught_the_trie():
    """A seeded request's sampled tokens depend on its tree shapes: it must not draft from the
    online layer (other requests' outputs), or its tokens would depend on other traffic.
    Greedy and unseeded sampled requests do draft from it."""
    from types import SimpleNamespace

    cfg = load_config({"drafter": {"type": "lookup_trie", "path": None, "online_mb": 1},
                       "tree": {"builder": "chain", "max_depth": 3}}, 8)
    drafter = make_drafter(cfg.drafter, None, cfg.tree, vocab_limit=64)
    assert drafter.capabilities.reads_sampling
    buf = np.array([[3, 4, 5, 6, 7, 8]] * 3, np.int32)
    sampling = [SimpleNamespace(temperature=0.0, seed=None), SimpleNamespace(temperature=0.7, seed=None),
                SimpleNamespace(temperature=0.7, seed=5)]
    inputs = DraftInputs(req_ids=["greedy", "sampled", "seeded"], token_ids=buf, rows=np.arange(3),
                         num_tokens=np.array([6, 6, 6]), budgets=np.array([3, 3, 3]), sampling=sampling)
    drafter.observe_output(np.array([20, 7, 8, 9, 10, 11], np.int32))
    drafts = [t.draft_token_ids() for t in drafter.propose(inputs).trees]
    assert drafts == [[9, 10, 11], [9, 10, 11], []]


def test_a_corpus_trie_learning_online_keeps_a_frozen_handle_for_seeded_requests():
    """With a trie file and online_mb, seeded sampled requests draft from the file's counts
    alone: a second handle on the same mapping, without the online layer."""
    from types import SimpleNamespace

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.trie"
        build_trie_from_streams([[1, 2, 3, 4] * 10], path, order=2, vocab_size=32)
        cfg = load_config({"drafter": {"type": "lookup_trie", "path": str(path), "online_mb": 1,
                                       "lookup_weight": 0.0},
                           "tree": {"builder": "chain", "max_depth": 2}}, 8)
        drafter = make_drafter(cfg.drafter, None, cfg.tree)
        assert drafter.seeded_trie.path == drafter.trie.path and drafter.seeded_trie.online_stats() is None
        for _ in range(20):                     # served outputs: after 1 comes 9, not 2
            drafter.observe_output(np.array([1, 9] * 4, np.int32))
        buf = np.array([[5, 1]] * 2, np.int32)
        inputs = DraftInputs(req_ids=["sampled", "seeded"], token_ids=buf, rows=np.arange(2),
                             num_tokens=np.array([2, 2]), budgets=np.array([1, 1]),
                             sampling=[SimpleNamespace(temperature=0.7, seed=None),
                                       SimpleNamespace(temperature=0.7, seed=3)])
        assert [t.draft_token_ids() for t in drafter.propose(inputs).trees] == [[9], [2]]


@pytest.mark.parametrize("seed", range(30))
def test_trees_with_recent_outputs_equal_the_reference(seed):
    """drafter.recent_max_ngram: matches of the suffix in observed outputs compete with the
    request's own matches (longest wins, own first at equal length), as the reference says."""
    rng = np.random.default_rng(500 + seed)
    vocab = int(rng.integers(3, 12))
    with random_trie_case(rng) as (trie, buf, rows, lens, params):
        buf = buf % vocab
        trie.enable_online(capacity_mb=1)
        trie.enable_recent(1 << 16)
        motif = rng.integers(vocab, size=int(rng.integers(3, 10))).tolist()
        outputs = []
        for _ in range(int(rng.integers(0, 6))):
            out = (rng.integers(vocab, size=int(rng.integers(0, 6))).tolist() + motif
                   + rng.integers(vocab, size=int(rng.integers(0, 30))).tolist())
            outputs.append(out)
            trie.observe(np.asarray(out, np.int32))
        p = {**params, "recent_max_ngram": int(rng.integers(2, 20)),
             "depth_per_match": float(rng.choice([0.0, 0.5, 1.0, 2.0]))}
        budgets = rng.integers(0, 30, size=len(rows))
        want = lookup_trie_trees_reference(buf, rows, lens, budgets, trie, recent=outputs, **p)
        for a, b in zip(native_trees(trie, buf, rows, lens, budgets, **p), want):
            same(a, b)
        assert trie.recent_stats()["observed_tokens"] == sum(len(o) for o in outputs)


def test_recent_outputs_draft_what_another_request_wrote_after_a_long_shared_context():
    """The online layer sees 4 tokens of context, after which earlier outputs differ (the more
    frequent one wins there); the recent outputs hold them verbatim and the request's longer
    suffix picks the one it follows. Seeded sampled requests never draft from them (other traffic)."""
    from types import SimpleNamespace

    shared = [5, 6, 7, 8]
    first = [30, 31, 32, 33] + shared + [40, 41, 42, 43]
    second = [50, 51, 52, 53] + shared + [60, 61, 62, 63]
    drafts = {}
    for recent in (0, 16):
        cfg = load_config({"drafter": {"type": "lookup_trie", "path": None, "online_mb": 1,
                                       "recent_max_ngram": recent},
                           "tree": {"builder": "chain", "max_depth": 4}}, 8)
        drafter = make_drafter(cfg.drafter, None, cfg.tree, vocab_limit=64)
        drafter.observe_output(np.array(first, np.int32))
        for _ in range(2):
            drafter.observe_output(np.array(second, np.int32))
        buf = np.array([[1, 2, 31, 32, 33] + shared] * 2, np.int32)
        inputs = DraftInputs(req_ids=["greedy", "seeded"], token_ids=buf, rows=np.arange(2),
                             num_tokens=np.array([9, 9]), budgets=np.array([4, 4]),
                             sampling=[SimpleNamespace(temperature=0.0, seed=None),
                                       SimpleNamespace(temperature=0.7, seed=1)])
        drafts[recent] = [t.draft_token_ids() for t in drafter.propose(inputs).trees]
    assert drafts[16] == [[40, 41, 42, 43], []]
    assert drafts[0][0] != [40, 41, 42, 43]     # the online layer alone follows the later output
    assert drafts[0][1] == []


def test_recent_outputs_stay_within_their_memory():
    """The store drops its oldest half when full, and still finds what it holds."""
    from vllm_treespec.ngram import empty_tries

    trie, _ = empty_tries(5, 64, 2)
    trie.enable_online(capacity_mb=1)
    trie.enable_recent(256)
    rng = np.random.default_rng(3)
    for _ in range(40):
        trie.observe(rng.integers(40, size=30).astype(np.int32))
    stats = trie.recent_stats()
    assert stats["observed_tokens"] == 1200 and stats["held_tokens"] <= 256
    last = [60, 61, 62, 63, 9, 9, 9]
    trie.observe(np.array(last, np.int32))
    buf = np.array([[1, 60, 61, 62]], np.int32)
    (tree,) = native_trees(trie, buf, [0], [4], [3], min_ngram=1, max_ngram=4, max_matches=4,
                           max_depth=3, k=4, min_context=1, lookup_weight=1.0, chain=True,
                           recent_max_ngram=8)
    assert tree.draft_token_ids() == [63, 9, 9]


def test_depth_per_match_sizes_drafts_by_the_matched_context():
    """drafter.depth_per_match: a 2-token match drafts at most 2 tokens at factor 1 and 4 at
    factor 2, however long the continuation; where nothing matched, the trie's context length
    (order - 1) caps it."""
    from vllm_treespec.ngram import empty_tries

    trie, _ = empty_tries(3, 64, 2)
    trie.enable_online(capacity_mb=1)
    trie.enable_recent(1 << 12)
    trie.observe(np.array([7, 8, 20, 21, 22, 23, 24, 25], np.int32))
    buf = np.array([[1, 7, 8], [1, 2, 3]], np.int32)
    kw = dict(min_ngram=1, max_ngram=4, max_matches=4, max_depth=8, k=4, min_context=1,
              lookup_weight=0.8, chain=True, recent_max_ngram=8)
    drafts = {f: [t.draft_token_ids() for t in native_trees(trie, buf, [0, 1], [3, 3], [8, 8],
                                                           **kw, depth_per_match=f)]
              for f in (0.0, 1.0, 2.0)}
    assert drafts[0.0][0] == [20, 21, 22, 23, 24, 25]
    assert drafts[1.0][0] == [20, 21] and drafts[2.0][0] == [20, 21, 22, 23]
    trie.observe(np.array([2, 3, 30, 31, 32, 33], np.int32))
    buf[1] = [9, 2, 3]                      # matches in recent outputs again: cap 2 at factor 1
    (_, tree) = native_trees(trie, buf, [0, 1], [3, 3], [8, 8], **kw, depth_per_match=1.0)
    assert tree.draft_token_ids() == [30, 31]
    (_, tree) = native_trees(trie, buf, [0, 1], [3, 3], [8, 8], **{**kw, "recent_max_ngram": 0},
                             depth_per_match=1.0)
    assert tree.draft_token_ids() == [30, 31]   # the order-3 trie alone: context 2, cap 2
    with pytest.raises(ValueError, match="depth_per_match"):
        native_trees(trie, buf, [0], [3], [8], **kw, depth_per_match=-1.0)
