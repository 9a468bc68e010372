"""The trie as the C++ builders' n-gram scorer (`TrieNgram`) gives what `TrieSignal` gives in Python."""
from __future__ import annotations

import gc
import math
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vllm_treespec.drafters.ngram_trie import TrieSignal
from vllm_treespec.native import native
from vllm_treespec.ngram import NgramTrie, build_trie_from_streams
from vllm_treespec.tree import DepthTable, DraftTree, build_tree
from vllm_treespec.tree.builders._native import _native_ngram

C = native()
SCORERS = ("dart", "presto", "presto_entropy")


def make(streams, order, tmp: str, **opts) -> NgramTrie:
    path = Path(tmp) / "t.trie"
    build_trie_from_streams(streams, path, order=order, **opts)
    return NgramTrie.load(path)


def libm_logprobs(trie: NgramTrie, context, cands, floor: float) -> list[float]:
    """Reference: the trie's probabilities (last order-1 tokens) through the C library's log."""
    probs = trie.prob(list(context)[-max(1, trie.order - 1):], np.asarray(cands, np.int32), floor=floor)
    return [math.log(p) if p > 0 else -math.inf for p in probs.tolist()]


def same(a: DraftTree, b: DraftTree) -> None:
    for f in ("tokens", "parents", "depth", "logprob", "score"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(vocab=st.integers(1, 8), order=st.integers(1, 5), floor=st.sampled_from([1e-10, 0.0, 0.5]),
       streams=st.lists(st.lists(st.integers(0, 7), max_size=30), max_size=6),
       contexts=st.lists(st.lists(st.integers(0, 9), max_size=7), min_size=1, max_size=5))
def test_scorer_is_the_log_of_the_trie_probability(vocab, order, floor, streams, contexts):
    streams = [[t % vocab for t in s] for s in streams]
    cands = np.arange(vocab + 2)  # includes ids the trie never saw
    with tempfile.TemporaryDirectory() as tmp:
        trie = make(streams, order, tmp, vocab_size=vocab)
        scorer = trie.scorer(floor)
        signal = TrieSignal(trie, floor=floor)
        assert isinstance(scorer, C.NgramScorer) and scorer.max_context == order - 1
        assert scorer.floor == floor and scorer.order == order
        for ctx in contexts:
            got = scorer.logprobs(np.array(ctx, dtype=np.int64), cands)
            assert got.tolist() == libm_logprobs(trie, ctx, cands, floor), ctx
            # TrieSignal takes np.log, which may differ from the C library's log in the last bit
            with np.errstate(divide="ignore"):
                want = signal.logprobs(ctx, cands)
            finite = np.isfinite(want)
            assert np.array_equal(np.isfinite(got), finite)
            np.testing.assert_array_max_ulp(got[finite], want[finite], maxulp=1)


def test_scorer_sees_the_online_layer_active_when_made(tmp_path):
    trie = make([[1, 2, 3, 1, 2, 3]], 3, str(tmp_path), vocab_size=8)
    before = trie.scorer(1e-10)
    trie.enable_online(capacity_mb=1.0, weight=2.0)
    trie.observe([1, 2, 4, 1, 2, 4, 1, 2, 4])
    after = trie.scorer(1e-10)
    cands = np.array([3, 4, 5])
    ctx = np.array([1, 2])
    assert after.logprobs(ctx, cands).tolist() == libm_logprobs(trie, [1, 2], cands, 1e-10)
    assert after.logprobs(ctx, cands)[1] > math.log(1e-10)  # (1, 2) -> 4 comes from the online layer
    assert before.logprobs(ctx, cands)[1] == math.log(1e-10)  # a snapshot: no online layer then


def test_scorer_keeps_the_trie_mapped(tmp_path):
    trie = make([[1, 2, 3, 1, 2, 3]], 3, str(tmp_path))
    want = libm_logprobs(trie, [1, 2], [3, 1], 1e-10)
    scorer = trie.scorer(1e-10)
    del trie
    gc.collect()
    assert scorer.logprobs(np.array([1, 2]), np.array([3, 1])).tolist() == want


def test_builders_recognise_a_trie_signal(tmp_path):
    trie = make([[1, 2, 3, 1, 2, 3]], 3, str(tmp_path))
    nat = _native_ngram(TrieSignal(trie))
    assert isinstance(nat, C.ngram.TrieNgram) and nat.floor == 1e-10


def random_stream(trie: NgramTrie, rng: np.random.Generator, n: int) -> list[int]:
    """Tokens that follow the trie's continuations (so contexts hit at every backoff order)."""
    out = [int(rng.integers(trie.vocab_size))]
    while len(out) < n:
        top = trie.topk(out[-(trie.order - 1):], 6)
        out.append(int(top[rng.integers(len(top))][0]) if top and rng.random() < 0.9
                   else int(rng.integers(trie.vocab_size)))
    return out


def trie_table(trie: NgramTrie, rng: np.random.Generator, depth: int, k: int) -> DepthTable:
    """A depth table whose candidates mix the trie's continuations of a sampled path with random
    tokens, with descending log-probs (ties included) and a sampled context."""
    stream = random_stream(trie, rng, 8 + depth)
    context, root, path = stream[:6], stream[6], stream[7:]
    tokens = np.full((depth, k), -1, dtype=np.int64)
    logprobs = np.full((depth, k), -np.inf)
    for d in range(depth):
        row = [t for t, _ in trie.topk(([root] + path)[: d + 1][-(trie.order - 1):], k)]
        row += rng.choice(trie.vocab_size, size=k, replace=False).tolist()
        row = list(dict.fromkeys(row))[:k]
        tokens[d, : len(row)] = row
        vals = np.sort(-rng.exponential(1.5, size=len(row)).round(int(rng.integers(1, 4))))[::-1]
        logprobs[d, : len(row)] = vals
    return DepthTable(tokens, logprobs, root=root, context=context, rho=TrieSignal(trie))


@pytest.fixture(scope="module")
def fixture_trie(tiny_model) -> NgramTrie:
    from treespec_fixtures.tries import build_trie_fixture

    return NgramTrie.load(build_trie_fixture("stdlib-3gram", tiny_model))


@pytest.mark.parametrize("scorer", SCORERS)
def test_cpp_builders_with_the_fixture_trie_equal_python(fixture_trie, scorer):
    rng = np.random.default_rng(sum(map(ord, scorer)))
    for _ in range(12):
        depth, k = int(rng.integers(1, 7)), int(rng.integers(1, 11))
        tab = trie_table(fixture_trie, rng, depth, k)
        budget = int(rng.integers(1, 40))
        beam = dict(width=int(rng.integers(1, 6)), topk=k, scorer=scorer, early_stop=bool(rng.integers(2)))
        same(build_tree("beam", tab, budget, backend="python", **beam),
             build_tree("beam", tab, budget, backend="cpp", **beam))
        best = dict(scorer=scorer, greedy_spine=bool(rng.integers(2)))
        same(build_tree("best_first", tab, budget, backend="python", **best),
             build_tree("best_first", tab, budget, backend="cpp", **best))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(order=st.integers(2, 4), seed=st.integers(0, 2**32 - 1), scorer=st.sampled_from(SCORERS))
def test_cpp_builders_with_a_random_trie_equal_python(order, seed, scorer):
    rng = np.random.default_rng(seed)
    vocab = int(rng.integers(4, 30))
    streams = [rng.integers(vocab, size=int(rng.integers(5, 80))).tolist() for _ in range(4)]
    with tempfile.TemporaryDirectory() as tmp:
        trie = make(streams, order, tmp, vocab_size=vocab)
        depth, k = int(rng.integers(1, 6)), int(rng.integers(1, min(vocab, 8) + 1))
        tab = trie_table(trie, rng, depth, k)
        budget = int(rng.integers(1, 30))
        beam = dict(width=int(rng.integers(1, 5)), topk=k, scorer=scorer)
        same(build_tree("beam", tab, budget, backend="python", **beam),
             build_tree("beam", tab, budget, backend="cpp", **beam))
        best = dict(scorer=scorer, greedy_spine=bool(rng.integers(2)))
        same(build_tree("best_first", tab, budget, backend="python", **best),
             build_tree("best_first", tab, budget, backend="cpp", **best))
