"""Trie queries equal the pure-Python dict reference: prob with backoff, topk, cursors, online layer."""
from __future__ import annotations

import tempfile
import threading
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from harness.dict_trie import DictTrie
from vllm_treespec.ngram import NgramTrie, build_trie_from_streams
from conftest import run_in_threads

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make(streams, order, tmp: str, **opts) -> NgramTrie:
    path = Path(tmp) / "t.trie"
    build_trie_from_streams(streams, path, order=order, **opts)
    return NgramTrie.load(path, verify=True)


@st.composite
def corpora(draw, max_vocab: int = 6):
    """Small alphabets and short streams: many repeated n-grams, many backoff cases."""
    vocab = draw(st.integers(1, max_vocab))
    streams = draw(st.lists(st.lists(st.integers(0, vocab - 1), max_size=30), min_size=0, max_size=8))
    return vocab, streams


def contexts_for(vocab: int):
    return st.lists(st.lists(st.integers(-1, vocab), max_size=7), min_size=1, max_size=6)


def check_prob(trie: NgramTrie, ref: DictTrie, contexts, vocab: int, floor: float = 0.0) -> None:
    cands = np.arange(-1, vocab + 2, dtype=np.int32)  # includes unseen and invalid ids
    probs, orders = trie.prob_batch(contexts, cands, floor=floor, return_orders=True)
    for i, ctx in enumerate(contexts):
        want = [ref.prob_order(ctx, int(c), floor) for c in cands]
        assert [float(p) for p in probs[i]] == [w[0] for w in want], ctx
        assert [int(o) for o in orders[i]] == [w[1] for w in want], ctx


def check_topk(trie: NgramTrie, ref: DictTrie, contexts, ks=(1, 2, 3, 50)) -> None:
    for ctx in contexts:
        for k in ks:
            assert trie.topk(ctx, k) == ref.topk(ctx, k), (ctx, k)


DENSE = st.sampled_from([None, 0, 1, 2])  # bitmap index: default (3 per 64 tokens), off, nearly everywhere


@SETTINGS
@given(corpus=corpora(), order=st.integers(1, 5), min_count=st.integers(1, 3), dense=DENSE, data=st.data())
def test_prob_and_topk_equal_reference(corpus, order, min_count, dense, data):
    vocab, streams = corpus
    contexts = data.draw(contexts_for(vocab))
    ref = DictTrie.build(streams, order, min_count=min_count)
    with tempfile.TemporaryDirectory() as tmp:
        trie = make(streams, order, tmp, min_count=min_count, vocab_size=vocab, dense_threshold=dense)
        assert trie.num_nodes == ref.num_nodes()
        check_prob(trie, ref, contexts, vocab, floor=1e-9)
        check_topk(trie, ref, contexts)


@SETTINGS
@given(corpus=corpora(max_vocab=70), order=st.integers(2, 5), threshold=st.integers(0, 3), cap=st.integers(1, 4),
       dense=DENSE, data=st.data())
def test_topk_through_top_lists(corpus, order, threshold, cap, dense, data):
    """Tiny top lists force both the early stop and the scan past an exhausted list."""
    vocab, streams = corpus
    contexts = data.draw(contexts_for(vocab))
    ref = DictTrie.build(streams, order)
    with tempfile.TemporaryDirectory() as tmp:
        trie = make(streams, order, tmp, vocab_size=vocab, top_threshold=threshold, top_cap=cap,
                    dense_threshold=dense)
        check_topk(trie, ref, contexts, ks=(1, 2, 3, 5, 9))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(corpus=corpora(max_vocab=70), order=st.integers(1, 5), dense=DENSE, k=st.sampled_from([1, 7, 70]),
       seed=st.integers(0, 2**32 - 1))
def test_long_batches_equal_reference(corpus, order, dense, k, seed):
    """Batches longer than the prefetch pipeline (contexts scored a few steps after their
    prefetches), per-row candidates, and more candidates than one lockstep chunk (64)."""
    vocab, streams = corpus
    rng = np.random.default_rng(seed)
    contexts = rng.integers(-1, vocab + 1, size=(int(rng.integers(13, 60)), 4)).astype(np.int32)
    cands = rng.integers(-1, vocab + 2, size=(len(contexts), k)).astype(np.int32)
    ref = DictTrie.build(streams, order)
    with tempfile.TemporaryDirectory() as tmp:
        trie = make(streams, order, tmp, vocab_size=vocab, dense_threshold=dense)
        probs, orders = trie.prob_batch(contexts, cands, floor=1e-9, return_orders=True)
        for i, ctx in enumerate(contexts.tolist()):
            want = [ref.prob_order(ctx, int(c), 1e-9) for c in cands[i]]
            assert [float(p) for p in probs[i]] == [w[0] for w in want], ctx
            assert [int(o) for o in orders[i]] == [w[1] for w in want], ctx
        np.testing.assert_array_equal(trie.prob_cursors(trie.cursors(contexts), cands, floor=1e-9), probs)
        no_candidates = np.zeros((len(contexts), 0), np.int32)
        assert trie.prob_batch(contexts, no_candidates).shape == (len(contexts), 0)


@SETTINGS
@given(corpus=corpora(), order=st.integers(1, 5), bits=st.integers(2, 6), data=st.data())
def test_count_scaling_equals_reference(corpus, order, bits, data):
    """Counts too large for the stored width are scaled by a shift; queries follow the stored counts."""
    vocab, streams = corpus
    contexts = data.draw(contexts_for(vocab))
    ref = DictTrie.build(streams, order, max_count_bits=bits)
    with tempfile.TemporaryDirectory() as tmp:
        trie = make(streams, order, tmp, vocab_size=vocab, max_count_bits=bits)
        assert trie.header["count_shift"] == ref.count_shift
        check_prob(trie, ref, contexts, vocab)
        check_topk(trie, ref, contexts)


@SETTINGS
@given(corpus=corpora(), order=st.integers(1, 5), data=st.data())
def test_cursor_extension_equals_fresh_queries(corpus, order, data):
    vocab, streams = corpus
    contexts = data.draw(contexts_for(vocab))
    steps = data.draw(st.lists(st.integers(-1, vocab), min_size=1, max_size=6))
    with tempfile.TemporaryDirectory() as tmp:
        trie = make(streams, order, tmp, vocab_size=vocab)
        cands = np.arange(-1, vocab + 1, dtype=np.int32)
        cur = trie.cursors(contexts)
        grown = [list(c) for c in contexts]
        for tok in steps:
            cur = trie.advance(cur, [tok] * len(contexts))
            for g in grown:
                g.append(tok)
            fresh = trie.cursors(grown)
            assert cur.tobytes() == fresh.tobytes()
            np.testing.assert_array_equal(trie.prob_cursors(cur, cands), trie.prob_batch(grown, cands))
            t1 = trie.topk_cursors(cur, 4)
            t2 = trie.topk_batch(grown, 4)
            for a, b in zip(t1, t2):
                np.testing.assert_array_equal(a, b)


def test_cursor_is_a_gatherable_value(tmp_path):
    """Beams fork and reorder cursors with plain numpy indexing."""
    trie = make([[0, 1, 2, 0, 1, 3, 0, 1, 2]], 3, str(tmp_path))
    cur = trie.cursors([[0], [2, 0]])
    assert cur.dtype.itemsize == 64
    forked = trie.advance(cur[[0, 0, 1, 1]], [1, 2, 1, 2])
    np.testing.assert_array_equal(
        trie.prob_cursors(forked, [2, 3]), trie.prob_batch([[0, 1], [0, 2], [2, 0, 1], [2, 0, 2]], [2, 3]))
    bad = cur.copy()
    bad["nodes"][0, 0] = 10**6
    with pytest.raises(ValueError, match="cursor"):
        trie.prob_cursors(bad, [1])


def test_candidates_per_row_and_shared(tmp_path):
    trie = make([[0, 1, 2, 3, 0, 1, 3]], 2, str(tmp_path))
    per_row = trie.prob_batch([[0], [1]], [[1, 2], [2, 3]])
    np.testing.assert_array_equal(per_row[0], trie.prob([0], [1, 2]))
    np.testing.assert_array_equal(per_row[1], trie.prob([1], [2, 3]))
    assert trie.prob([1], [2, 3]).tolist() == [0.5, 0.5]
    assert trie.prob([9], [0]).tolist() == [2 / 7]  # unseen context: unigram
    assert trie.prob([0], [99], floor=1e-6).tolist() == [1e-6]
    with pytest.raises(ValueError):
        trie.prob_batch([[0], [1]], [[1, 2]])


@SETTINGS
@given(corpus=corpora(), order=st.integers(1, 4), weight=st.sampled_from([0.5, 1.0, 2.0]), data=st.data())
def test_online_layer_equals_reference(corpus, order, weight, data):  # (default dense index: vocab <= 6)
    """With at most 6 continuations per context and no eviction, online counts are exact."""
    vocab, streams = corpus
    served = data.draw(st.lists(st.lists(st.integers(-1, vocab - 1), max_size=20), max_size=4))
    contexts = data.draw(contexts_for(vocab))
    ref = DictTrie.build(streams, order)
    ref.weight = weight
    with tempfile.TemporaryDirectory() as tmp:
        trie = make(streams, order, tmp, vocab_size=vocab)
        trie.enable_online(capacity_mb=1, weight=weight)
        for s in served:
            trie.observe(s)
            ref.observe(s)
        assert trie.online_stats()["evictions"] == 0
        check_prob(trie, ref, contexts, vocab)
        check_topk(trie, ref, contexts)
        trie.clear_online()
        assert trie.online_stats()["used_slots"] == 0


def test_online_layer_memory_is_bounded(tmp_path):
    trie = make([[0, 1, 2]], 3, str(tmp_path), vocab_size=5000)
    trie.enable_online(capacity_mb=0.01, weight=1.0)
    before = trie.online_stats()["memory_bytes"]
    rng = np.random.default_rng(0)
    for _ in range(20):
        trie.observe(rng.integers(0, 5000, size=500))
    stats = trie.online_stats()
    assert stats["memory_bytes"] == before <= 0.01 * (1 << 20)
    assert stats["evictions"] > 0 and stats["used_slots"] <= stats["slots"]
    probs = trie.prob_batch(rng.integers(0, 5000, size=(64, 2)), rng.integers(0, 5000, size=(64, 8)))
    assert np.all((probs >= 0) & (probs <= 1))
    with pytest.raises(ValueError, match="vocabulary"):
        trie.observe([5000])


def test_queries_are_thread_safe(tmp_path):
    """Concurrent queries (GIL released) and online updates give the single-threaded answers."""
    rng = np.random.default_rng(1)
    streams = [rng.integers(0, 50, size=400) for _ in range(10)]
    trie = make(streams, 3, str(tmp_path), vocab_size=50)
    contexts = rng.integers(0, 50, size=(256, 2))
    cands = rng.integers(0, 50, size=(256, 25))
    want = trie.prob_batch(contexts, cands)
    want_top = trie.topk_batch(contexts, 8)

    def query() -> None:
        for _ in range(30):
            np.testing.assert_array_equal(trie.prob_batch(contexts, cands), want)
            np.testing.assert_array_equal(trie.topk_batch(contexts, 8)[0], want_top[0])

    run_in_threads(query)

    trie.enable_online(capacity_mb=0.05, weight=1.0)
    stop = threading.Event()

    def learn() -> None:
        while not stop.is_set():
            trie.observe(rng.integers(0, 50, size=64))

    writer = threading.Thread(target=learn)
    writer.start()
    try:
        for _ in range(50):
            p = trie.prob_batch(contexts, cands)
            assert np.all((p > 0) & (p <= 1))
    finally:
        stop.set()
        writer.join()
