"""The C++ prompt-lookup matcher equals a plain Python reference."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_treespec.config import PromptLookupConfig
from vllm_treespec.drafters import DraftInputs
from vllm_treespec.drafters.prompt_lookup import PromptLookupDrafter
from vllm_treespec.native import native

C = native()


def reference_matches(tokens, min_n, max_n, k):
    """All (continuation_start, match_len, continuation_len), best first."""
    n = len(tokens)
    found = []
    for j in range(n - 1):  # match ends at j, continuation starts at j + 1 < n
        length = 0
        while length < max_n and length <= j and tokens[j - length] == tokens[n - 1 - length]:
            length += 1
        if length >= min_n:
            found.append((j + 1, length, min(k, n - (j + 1))))
    found.sort(key=lambda m: (-m[1], -m[2], -m[0]))
    return found


token_lists = st.lists(st.integers(0, 4), min_size=0, max_size=60)


@settings(max_examples=400, deadline=None)
@given(tokens=token_lists, min_n=st.integers(1, 4), extra=st.integers(0, 3), k=st.integers(1, 9),
       max_matches=st.integers(1, 5))
def test_matches_equal_reference(tokens, min_n, extra, k, max_matches):
    arr = np.array(tokens, dtype=np.int32)
    got = C.find_suffix_matches(arr, min_n, min_n + extra, k, max_matches)
    want = reference_matches(tokens, min_n, min_n + extra, k)[:max_matches]
    assert [tuple(m) for m in got] == want


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(token_lists, min_size=1, max_size=6), k=st.integers(1, 8),
       limits=st.lists(st.integers(0, 10), min_size=6, max_size=6))
def test_batched_chain_equals_reference(rows, k, limits):
    width = max(1, max(len(r) for r in rows))
    buf = np.full((len(rows) + 2, width), 7, dtype=np.int32)  # padding rows/cols must be ignored
    for i, r in enumerate(rows):
        buf[i + 1, : len(r)] = r
    idx = np.arange(1, len(rows) + 1, dtype=np.int64)
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    lim = np.array(limits[: len(rows)], dtype=np.int64)
    drafts, counts = C.propose_chain_batch(buf, idx, lengths, lim, 1, 3, k)
    for i, r in enumerate(rows):
        kk = min(k, lim[i])
        best = reference_matches(r, 1, 3, kk)[:1] if kk > 0 else []
        want = r[best[0][0]: best[0][0] + best[0][2]] if best else []
        assert counts[i] == len(want)
        assert drafts[i, : counts[i]].tolist() == want
        assert (drafts[i, counts[i]:] == -1).all()


def test_invalid_arguments_raise_clear_errors():
    buf = np.zeros((2, 4), dtype=np.int32)
    one = np.array([0], dtype=np.int64)
    with pytest.raises(ValueError, match="min_n"):
        C.propose_chain_batch(buf, one, one, one, 0, 3, 4)
    with pytest.raises(ValueError, match="k >= 1"):
        C.propose_chain_batch(buf, one, one, one, 1, 3, 0)
    with pytest.raises(IndexError, match="out of range"):
        C.propose_chain_batch(buf, np.array([5]), one, one, 1, 3, 4)
    with pytest.raises(IndexError, match="out of range"):
        C.propose_chain_batch(buf, one, np.array([9]), one, 1, 3, 4)


def test_drafter_respects_budgets_and_skips_zero_budget():
    buf = np.array([[1, 2, 3, 4, 1, 2, 3, 0], [5, 6, 5, 6, 5, 0, 0, 0]], dtype=np.int32)
    drafter = PromptLookupDrafter(PromptLookupConfig(type="prompt_lookup", min_ngram=1, max_ngram=3))
    inputs = DraftInputs(req_ids=["a", "b"], token_ids=buf, rows=np.array([0, 1]),
                         num_tokens=np.array([7, 5]), budgets=np.array([2, 0]))
    assert drafter.propose_chains(inputs) == [[4, 1], []]
    inputs.budgets = np.array([8, 8])
    assert drafter.propose_chains(inputs) == [[4, 1, 2, 3], [6, 5]]
