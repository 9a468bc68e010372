"""Prompt-lookup trees: the C++ batch equals the Python reference, cuts are prefixes, one match
is the chain drafter, nothing past a request's length is read, bad arguments fail cleanly."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import run_in_threads
from vllm_treespec.config import PromptLookupConfig
from vllm_treespec.drafters import DraftInputs
from vllm_treespec.drafters.lookup_tree import lookup_trees, lookup_trees_reference
from vllm_treespec.drafters.prompt_lookup import PromptLookupDrafter
from vllm_treespec.native import native
from vllm_treespec.tree import DraftTree

C = native()
GARBAGE = 99  # never a real token below: finding it in a tree means a read past the length
BUDGETS = (0, 1, 8, 64)


def random_tokens(rng: np.random.Generator) -> np.ndarray:
    """Small vocab and sometimes a noisy period, so suffix matches are common and continuations
    both agree and disagree."""
    n = int(rng.integers(1, 90))
    vocab = int(rng.integers(2, 6))
    if rng.random() < 0.5:
        return rng.integers(0, vocab, n).astype(np.int32)
    period = rng.integers(0, vocab, int(rng.integers(2, 8)))
    seq = np.resize(period, n)
    noise = rng.random(n) < 0.15
    seq[noise] = rng.integers(0, vocab, int(noise.sum()))
    return seq.astype(np.int32)


def make_batch(rng: np.random.Generator, num: int, fill: int = GARBAGE):
    """A [num + 2, width] buffer whose spare rows and tails past each length hold `fill`."""
    seqs = [random_tokens(rng) for _ in range(num)]
    width = max(len(s) for s in seqs) + int(rng.integers(0, 5))
    buf = np.full((num + 2, width), fill, dtype=np.int32)
    rows = rng.permutation(num + 2)[:num].astype(np.int64)
    for r, s in zip(rows, seqs):
        buf[r, :len(s)] = s
    return buf, rows, np.array([len(s) for s in seqs], dtype=np.int64), seqs


def params(max_matches: int, rng: np.random.Generator) -> dict:
    min_n = int(rng.integers(1, 4))
    return dict(min_ngram=min_n, max_ngram=min_n + int(rng.integers(0, 3)),
                max_matches=max_matches, max_depth=int(rng.integers(1, 12)),
                continue_prob=float(rng.choice([1.0, 0.9, 0.5])))


def chain(seq: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """propose_chain's drafts for one sequence (k = the most tokens, also its ranking cap)."""
    drafts, counts = C.propose_chain_batch(seq[None, :], np.array([0]), np.array([len(seq)]),
                                           np.array([k]), min_n, max_n, k)
    return drafts[0, :counts[0]].tolist()


@pytest.mark.parametrize("max_matches", [1, 4, 16])
def test_native_equals_reference_over_random_batches(max_matches):
    for seed in range(150):
        rng = np.random.default_rng([seed, max_matches])
        buf, rows, lengths, seqs = make_batch(rng, 6)
        kw = params(max_matches, rng)
        for budget in BUDGETS:
            budgets = np.full(len(rows), budget, dtype=np.int64)
            got = lookup_trees(buf, rows, lengths, budgets, **kw)
            want = lookup_trees_reference(buf, rows, lengths, budgets, **kw)
            assert got == want, (seed, budget, kw)
            for tree, seq in zip(got, seqs):
                check_tree(tree, seq, budget, kw)


def check_tree(tree: DraftTree, seq: np.ndarray, budget: int, kw: dict) -> None:
    assert tree.validate() is tree
    assert tree.root == int(seq[-1])
    assert tree.num_draft <= budget
    assert tree.max_depth <= kw["max_depth"]
    assert (tree.tokens.dtype, tree.parents.dtype, tree.depth.dtype) == (np.int64,) * 3
    assert (tree.logprob.dtype, tree.score.dtype) == (np.float32, np.float32)
    # score = log(weight / matches): never rises along a path, which makes the order topological.
    assert (tree.score[1:] <= tree.score[tree.parents[1:]]).all()
    text = seq.tolist()
    for i in range(1, tree.num_nodes):  # every path is text that occurs before the length
        path = list(tree.path_tokens(i))
        assert any(text[s:s + len(path)] == path for s in range(1, len(text) - len(path) + 1))


@pytest.mark.parametrize("max_matches", [1, 4, 16])
def test_smaller_budgets_give_prefixes_of_larger_ones(max_matches):
    for seed in range(60):
        rng = np.random.default_rng([seed, max_matches, 1])
        seq = random_tokens(rng)
        kw = params(max_matches, rng)
        budgets = np.arange(0, 41, dtype=np.int64)  # the same request once per budget
        trees = lookup_trees(seq[None, :], np.zeros_like(budgets),
                             np.full_like(budgets, len(seq)), budgets, **kw)
        full = trees[-1]
        for n, tree in enumerate(trees):
            assert tree == full.prefix(min(n, full.num_draft)), (seed, n)


def test_one_match_is_the_chain_cut_to_the_budget():
    for seed in range(300):
        rng = np.random.default_rng([seed, 2])
        seq = random_tokens(rng)
        kw = params(1, rng)
        want = chain(seq, kw["min_ngram"], kw["max_ngram"], kw["max_depth"])
        for budget in BUDGETS + (kw["max_depth"],):
            (tree,) = lookup_trees(seq[None, :], [0], [len(seq)], [budget], **kw)
            assert tree == DraftTree.chain(int(seq[-1]), want[:budget]), (seed, budget)


def test_one_match_equals_the_chain_drafter_at_budget_max_depth():
    """The chain drafter ranks matches with continuations capped at the budget, the tree at
    max_depth (so its cuts are prefixes); at budget = max_depth both rank alike."""
    buf, rows, lengths, _ = make_batch(np.random.default_rng(11), 40)
    for depth in (1, 4, 8):
        drafter = PromptLookupDrafter(PromptLookupConfig(type="prompt_lookup", min_ngram=1,
                                                         max_ngram=3))
        budgets = np.full(len(rows), depth)
        drafts = drafter.propose_chains(DraftInputs([str(i) for i in range(len(rows))], buf, rows,
                                             lengths, budgets))
        trees = lookup_trees(buf, rows, lengths, budgets, min_ngram=1, max_ngram=3,
                             max_matches=1, max_depth=depth)
        assert [t.draft_token_ids() for t in trees] == drafts
        assert sum(map(len, drafts)) >= len(rows) // 2 * depth  # mostly non-trivial


def test_more_matches_hedge_and_weights_order_nodes():
    seq = np.array([1, 2, 3, 1, 2, 4, 1, 2, 3, 1, 2, 5, 1, 2], dtype=np.int32)
    # Matches of "1 2", best first: ...3 1 2 5 | 4 1 2 3 | 3 1 2 4 | 5 1 2 (end of text).
    tokens, parents, depth, weight, logprob, score, counts = C.propose_tree_batch(
        seq[None, :], np.array([0]), np.array([14]), np.array([8]), 1, 3, 8, 4)
    assert counts.tolist() == [8]
    assert tokens.tolist() == [2, 3, 1, 2, 5, 4, 1, 2, 3]
    assert parents.tolist() == [-1, 0, 1, 2, 3, 0, 5, 6, 7]
    assert depth.tolist() == [0, 1, 2, 3, 4, 1, 2, 3, 4]
    assert weight.tolist() == [4, 2, 2, 2, 1, 1, 1, 1, 1]
    np.testing.assert_allclose(np.exp(logprob), [1, .5, 1, 1, .5, .25, 1, 1, 1], rtol=1e-6)
    np.testing.assert_allclose(np.exp(score), weight / 4, rtol=1e-6)


def test_garbage_after_the_length_changes_nothing():
    rng = np.random.default_rng(7)
    buf, rows, lengths, _ = make_batch(rng, 8)
    kw = dict(min_ngram=1, max_ngram=3, max_matches=8, max_depth=10)
    budgets = np.full(8, 64)
    want = lookup_trees(buf, rows, lengths, budgets, **kw)
    for fill in (0, 1, 2):  # tokens that would extend matches if they were read
        other = buf.copy()
        for r, n in zip(rows, lengths):
            other[r, n:] = fill
        other[np.setdiff1d(np.arange(len(buf)), rows)] = fill
        assert lookup_trees(other, rows, lengths, budgets, **kw) == want


def test_root_only_trees():
    buf = np.array([[4, 5, 6, 7], [3, 3, 3, 3]], dtype=np.int32)
    kw = dict(min_ngram=1, max_ngram=2, max_matches=4, max_depth=4)
    trees = lookup_trees(buf, [0, 1, 1, 1], [4, 4, 1, 4], [8, 0, 8, 8], **kw)
    assert [t.num_draft for t in trees] == [0, 0, 0, 2]  # no match, budget 0, no history; only
    # the two matches of the longest suffix (3 3) count: their continuations 3 3 and 3
    assert [t.root for t in trees] == [7, 3, 3, 3]
    assert lookup_trees(buf, [], [], [], **kw) == []


def test_bad_arguments_raise_python_errors():
    buf = np.zeros((2, 4), dtype=np.int32)
    kw = dict(min_ngram=1, max_ngram=3, max_matches=4, max_depth=4)
    ok = ([0], [4], [2])
    cases = [
        (ValueError, "min_ngram", (buf, *ok), dict(kw, min_ngram=3, max_ngram=2)),
        (ValueError, "min_ngram", (buf, *ok), dict(kw, min_ngram=0)),
        (ValueError, "max_matches", (buf, *ok), dict(kw, max_matches=0)),
        (ValueError, "max_depth", (buf, *ok), dict(kw, max_depth=0)),
        (ValueError, "negative", (buf, [0], [4], [-1]), kw),
        (IndexError, "row 2", (buf, [2], [4], [2]), kw),
        (IndexError, "row -1", (buf, [-1], [4], [2]), kw),
        (IndexError, "length 5", (buf, [0], [5], [2]), kw),
        (IndexError, "length 0", (buf, [0], [0], [2]), kw),
        (ValueError, "num_tokens has 2", (buf, [0], [4, 4], [2]), kw),
        (TypeError, "int32", (buf.astype(np.int64), *ok), kw),
        (TypeError, "int32", (buf[0], *ok), kw),
        (TypeError, "numpy", (buf.tolist(), *ok), kw),
        (TypeError, "rows must hold integers", (buf, [0.0], [4], [2]), kw),
    ]
    for exc, match, args, kwargs in cases:
        with pytest.raises(exc, match=match):
            lookup_trees(*args, **kwargs)


def test_native_binding_rejects_wrong_dtypes_without_crashing():
    buf = np.zeros((2, 4), dtype=np.int32)
    one = np.array([1], dtype=np.int64)
    with pytest.raises(TypeError):
        C.propose_tree_batch(buf.astype(np.float32), one, one, one, 1, 2, 4, 4)
    with pytest.raises(TypeError):
        C.propose_tree_batch(buf.astype(np.int64), one, one, one, 1, 2, 4, 4)
    with pytest.raises(TypeError):
        C.propose_tree_batch(buf, one.astype(np.float64), one, one, 1, 2, 4, 4)
    with pytest.raises(ValueError, match="same length"):
        C.propose_tree_batch(buf, one, np.array([1, 1]), one, 1, 2, 4, 4)
    with pytest.raises(ValueError, match="2-D"):
        C.propose_tree_batch(buf[0], one, one, one, 1, 2, 4, 4)


def test_concurrent_calls_agree():
    rng = np.random.default_rng(3)
    buf, rows, lengths, _ = make_batch(rng, 16)
    kw = dict(min_ngram=1, max_ngram=4, max_matches=8, max_depth=8)
    budgets = np.full(16, 32)
    want = lookup_trees(buf, rows, lengths, budgets, **kw)

    def work() -> None:
        for _ in range(50):
            assert lookup_trees(buf, rows, lengths, budgets, **kw) == want

    run_in_threads(work)


def test_continue_prob_trades_the_deep_tail_for_shallow_alternatives():
    seq = np.array([1, 2, 3, 4, 5, 6, 9, 1, 2, 7, 8, 9, 9, 1, 2, 3, 4, 5, 6, 9, 1, 2], dtype=np.int32)
    kw = dict(min_ngram=1, max_ngram=2, max_matches=8, max_depth=6)
    by_weight = lookup_trees(seq[None, :], [0], [len(seq)], [5], **kw)[0]
    hedged = lookup_trees(seq[None, :], [0], [len(seq)], [5], continue_prob=0.5, **kw)[0]
    # "1 2" was followed by 3 4 5 6 twice and by 7 8 once
    assert by_weight.draft_token_ids() == [3, 4, 5, 6, 9]
    assert hedged.draft_token_ids() == [3, 4, 7, 5, 8]
    with pytest.raises(ValueError, match="continue_prob"):
        lookup_trees(seq[None, :], [0], [len(seq)], [5], continue_prob=0.0, **kw)
