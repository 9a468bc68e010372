"""The C++ builders and n-gram table give exactly what the Python reference gives."""
from __future__ import annotations


import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.random_trees import random_depth_table, random_ngram
from vllm_treespec.native import native
from vllm_treespec.tree import DraftTree, NgramTable, build_tree
from conftest import run_in_threads

C = native()
SCORERS = ("acc_logp", "dart", "presto", "presto_entropy")
seeds = st.integers(0, 2**32 - 1)


def table_with_ngram(seed, depth, k, vocab, ties, pad, order=3, native_rho=False):
    rng = np.random.default_rng(seed)
    ngram = random_ngram(rng, vocab=vocab, order=order, entries=int(rng.integers(0, 600)))
    tab = random_depth_table(rng, depth, k, vocab=vocab, ties=ties, pad=pad, rho=ngram)
    return tab, ngram


def same(a: DraftTree, b: DraftTree):
    for f in ("tokens", "parents", "depth", "logprob", "score"):
        assert np.array_equal(getattr(a, f), getattr(b, f)), f


@settings(max_examples=120, deadline=None)
@given(seed=seeds, depth=st.integers(1, 8), k=st.integers(1, 12), width=st.integers(1, 12),
       budget=st.integers(0, 120), scorer=st.sampled_from(SCORERS), ties=st.booleans(),
       pad=st.booleans(), early_stop=st.booleans(), order=st.integers(1, 4))
def test_cpp_beam_equals_python(seed, depth, k, width, budget, scorer, ties, pad, early_stop,
                                order):
    tab, _ = table_with_ngram(seed, depth, k, 40, ties, pad, order)
    kw = dict(width=width, topk=k, scorer=scorer, early_stop=early_stop)
    same(build_tree("beam", tab, budget, backend="python", **kw),
         build_tree("beam", tab, budget, backend="cpp", **kw))


@settings(max_examples=120, deadline=None)
@given(seed=seeds, depth=st.integers(1, 8), k=st.integers(1, 12), budget=st.integers(0, 150),
       scorer=st.sampled_from(SCORERS), ties=st.booleans(), pad=st.booleans(),
       spine=st.booleans())
def test_cpp_best_first_equals_python(seed, depth, k, budget, scorer, ties, pad, spine):
    tab, _ = table_with_ngram(seed, depth, k, 40, ties, pad)
    kw = dict(scorer=scorer, greedy_spine=spine)
    same(build_tree("best_first", tab, budget, backend="python", **kw),
         build_tree("best_first", tab, budget, backend="cpp", **kw))


def test_cpp_at_dart_defaults_equals_python():
    for seed in range(3):
        tab, _ = table_with_ngram(seed, 8, 25, 1000, False, False)
        same(build_tree("beam", tab, 59, scorer="dart", backend="python"),
             build_tree("beam", tab, 59, scorer="dart", backend="cpp"))


@settings(max_examples=80, deadline=None)
@given(seed=seeds, order=st.integers(1, 5), vocab=st.integers(1, 12),
       queries=st.lists(st.lists(st.integers(0, 11), max_size=7), min_size=1, max_size=10))
def test_cpp_ngram_table_equals_python(seed, order, vocab, queries):
    rng = np.random.default_rng(seed)
    py = random_ngram(rng, vocab=vocab, order=order, entries=int(rng.integers(0, 200)))
    cpp = py.native()
    assert len(cpp) == len(py) and cpp.order == order and cpp.max_context == order - 1
    cands = np.arange(12)
    for q in queries:
        want = py.logprobs(q, cands)
        assert cpp.logprobs(np.array(q, dtype=np.int64), cands).tolist() == want.tolist()
        assert cpp.logprob(np.array(q, dtype=np.int64), 3) == py.logprob(q, 3)


def test_ngram_backoff_rule():
    t = NgramTable(order=3, floor=-9.0).extend([((5, 6), 7, -0.5), ((6,), 7, -1.5), ((), 7, -3.0),
                                                ((6,), 8, -2.0)])
    for table in (t, t.native()):
        assert table.logprob(np.array([1, 5, 6]), 7) == -0.5  # longest suffix
        assert table.logprob(np.array([4, 6]), 7) == -1.5
        assert table.logprob(np.array([4, 6]), 8) == -2.0
        assert table.logprob(np.array([5, 6]), 8) == -2.0  # (5, 6) exists, not for 8: back off
        assert table.logprob(np.array([9]), 7) == -3.0
        assert table.logprob(np.array([9]), 8) == -9.0  # floor
    with pytest.raises(ValueError, match="longer than order-1"):
        t.add((1, 2, 3), 4, -1.0)
    with pytest.raises(ValueError, match="order must be in"):
        C.NgramTable(9, -1.0)


def test_cpp_scorer_object_works_as_python_rho():
    rng = np.random.default_rng(5)
    ngram = random_ngram(rng, vocab=30)
    tab_py = random_depth_table(np.random.default_rng(6), 4, 6, vocab=30, rho=ngram)
    tab_cpp = random_depth_table(np.random.default_rng(6), 4, 6, vocab=30, rho=ngram.native())
    for backend in ("python", "cpp"):
        same(build_tree("beam", tab_py, 30, scorer="presto", width=4, backend="python"),
             build_tree("beam", tab_cpp, 30, scorer="presto", width=4, backend=backend))


def test_builders_run_concurrently_without_the_gil():
    tab, _ = table_with_ngram(11, 8, 25, 1000, False, False)
    want_beam = build_tree("beam", tab, 59, scorer="dart")
    want_bf = build_tree("best_first", tab, 128, scorer="presto")

    def work():
        for _ in range(20):
            same(build_tree("beam", tab, 59, scorer="dart"), want_beam)
            same(build_tree("best_first", tab, 128, scorer="presto"), want_bf)

    run_in_threads(work)


def test_native_input_errors():
    tok = np.array([[1, 2], [3, -1]])
    args = dict(tokens=tok, logq=np.zeros((2, 2)), topk=np.array([2, 2]), a=np.ones(2),
                b=np.zeros(2), c=np.ones(2), smooth=False, eps=0.0, context=np.array([1]),
                ngram=None, root=1)
    with pytest.raises(ValueError, match="topk covers -1 padding at depth 1"):
        C.tree_beam_search(**args, width=2, budget=3, early_stop=False)
    args.update(topk=np.array([2, 1]), b=np.array([0.0, 0.5]))
    with pytest.raises(ValueError, match="needs an n-gram scorer"):
        C.tree_best_first(**args, budget=3, greedy_spine=False)
