"""Greedy acceptance equals the brute-force longest argmax-matching path: the C++ walk
(verify.greedy_walk on the host), its test-only torch reference, and greedy requests inside a
sampled batch (handed to the greedy walk)."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from support.greedy_reference import accept_greedy
from support.verify_cases import biased_logits, greedy_reference, random_tree_batch
from vllm_treespec.tree import TreeBatch
from vllm_treespec.verify import SamplingParamsBatch, accept, greedy_walk


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _host_walk(tree, logits, max_depth=None):
    """verify.greedy_walk with accept_greedy's width (deepest node + 1, or max_depth + 1)."""
    width = accept_greedy(tree, logits, max_depth).emitted.shape[1]
    return greedy_walk(tree, logits, width)


GREEDY_RULES = {"walk": _host_walk, "reference": accept_greedy}


def _check_against_reference(tree, logits, res):
    offsets = tree.offsets.tolist()
    width = res.emitted.shape[1]
    for b in range(len(offsets) - 1):
        lo, hi = offsets[b], offsets[b + 1]
        toks = tree.tokens[lo:hi].tolist()
        pars = tree.parents[lo:hi].tolist()
        emitted, path = greedy_reference(toks, pars, logits[lo:hi])
        n = len(emitted)
        assert res.num_emitted[b] == n
        assert res.emitted[b, :n].tolist() == emitted
        assert (res.emitted[b, n:] == -1).all()
        assert res.accepted_nodes[b, : n - 1].tolist() == path
        assert (res.accepted_nodes[b, n - 1 :] == -1).all()
        assert res.accepted_rows[b, : n - 1].tolist() == [lo + v for v in path]
        assert width >= n


@pytest.mark.parametrize("rule", list(GREEDY_RULES))
@pytest.mark.parametrize("vocab", [5, 12, 64])
def test_greedy_matches_brute_force(vocab, rule):
    rng = np.random.default_rng(vocab)
    for _ in range(8):
        sizes = rng.integers(1, 30, size=int(rng.integers(1, 9))).tolist()
        tree = random_tree_batch(rng, sizes, vocab)
        logits = biased_logits(rng, tree, vocab, follow=0.75, boost=5.0)
        res = GREEDY_RULES[rule](tree, logits)
        _check_against_reference(tree, logits, res)


@pytest.mark.parametrize("mode", ["target_only", "rrs"])
def test_temperature_zero_requests_are_greedy_in_stochastic_modes(mode):
    rng = np.random.default_rng(7)
    vocab = 9
    sizes = rng.integers(1, 25, size=12).tolist()
    tree = random_tree_batch(rng, sizes, vocab)
    logits = biased_logits(rng, tree, vocab, follow=0.75, boost=5.0)
    draft = torch.softmax(torch.randn(logits.shape, generator=torch.Generator().manual_seed(0)), -1)
    # Greedy requests mixed with sampled ones; filters set on greedy rows must not matter.
    temps = [0.0 if b % 2 == 0 else 0.9 for b in range(len(sizes))]
    params = SamplingParamsBatch.from_lists(
        temps, top_k=[2] * len(sizes), top_p=[0.5] * len(sizes), min_p=[0.3] * len(sizes)
    )
    res = accept(
        tree, logits, mode=mode, sampling=params, generators=torch.Generator().manual_seed(3),
        draft_probs=draft if mode == "rrs" else None, replacement=False if mode == "rrs" else None,
    )
    ref = accept_greedy(tree, logits)
    greedy_rows = torch.tensor([t == 0.0 for t in temps])
    assert torch.equal(res.emitted[greedy_rows], ref.emitted[greedy_rows])
    assert torch.equal(res.accepted_nodes[greedy_rows], ref.accepted_nodes[greedy_rows])


@pytest.mark.parametrize("rule", list(GREEDY_RULES))
def test_greedy_ties_take_first_index_and_low_precision_logits(rule):
    # Root row ties between tokens 3 and 1: argmax picks 1 (first index), which is a child.
    tree = TreeBatch.from_arrays([0, 3], [0, 3, 1], [-1, 0, 0])
    logits = torch.zeros(3, 6, dtype=torch.bfloat16)
    logits[0, 3] = logits[0, 1] = 2.0
    logits[2, 4] = 1.0
    res = GREEDY_RULES[rule](tree, logits)
    assert res.emitted.tolist() == [[1, 4]]
    assert res.accepted_nodes.tolist() == [[2, -1]]


@pytest.mark.parametrize("rule", list(GREEDY_RULES))
def test_root_only_requests_emit_one_bonus_token_and_padding(rule):
    tree = TreeBatch.from_arrays([0, 1, 4, 5], [9, 9, 2, 3, 9], [-1, -1, 0, 1, -1])
    logits = torch.full((5, 6), -1.0)
    logits[0, 5] = 1.0  # request 0: bonus 5
    logits[1, 2] = logits[2, 3] = logits[3, 0] = 1.0  # request 1: path 2, 3 then bonus 0
    logits[4, 4] = 1.0
    res = GREEDY_RULES[rule](tree, logits, max_depth=4)
    assert res.emitted.tolist() == [[5, -1, -1, -1, -1], [2, 3, 0, -1, -1], [4, -1, -1, -1, -1]]
    assert res.num_emitted.tolist() == [1, 3, 1]
    assert res.num_accepted.tolist() == [0, 2, 0]
    assert res.accepted_nodes.tolist()[1] == [1, 2, -1, -1, -1]
    assert res.accepted_rows.tolist()[1] == [2, 3, -1, -1, -1]


def test_greedy_is_not_a_mode_of_accept():
    """accept() holds the sampled rules only; the greedy rule is the greedy walk."""
    tree = TreeBatch.root_only([3])
    with pytest.raises(ValueError, match="greedy_walk"):
        accept(tree, torch.randn(1, 5), mode="greedy")


def _argmax_first_walk(tree, logits, rows, width):
    """The walk fed vLLM's argmax of every node row up front (greedy_tokens), as the host walk
    did before it read the logits itself."""
    from vllm_treespec.native import native
    from vllm_treespec.verify.sampling_params import greedy_tokens

    target = greedy_tokens(logits[rows]).to(torch.int64)
    return native().greedy_tree_walk(tree.offsets.numpy(), tree.tokens.numpy(), tree.parents.numpy(),
                                     target.numpy(), width)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("vocab", [1, 7, 8, 1003])
def test_walk_reading_the_logits_equals_the_argmax_of_every_row(dtype, vocab):
    """The host walk takes the argmax itself, only at the rows it visits: bitwise the tokens of
    vLLM's argmax over every row first, with ties (first index wins), NaN rows (the first NaN
    wins), all -inf rows, bf16 logits, logits rows named by `rows` in a larger strided tensor."""
    rng = np.random.default_rng(vocab)
    for case in range(12):
        sizes = rng.integers(1, 20, size=int(rng.integers(1, 7))).tolist()
        tree = random_tree_batch(rng, sizes, vocab)
        t = tree.tokens.numel()
        node_logits = biased_logits(rng, tree, vocab, follow=0.8, boost=5.0)
        node_logits = torch.round(node_logits * 2) / 2          # many exact ties
        special = rng.random(t)
        node_logits[special < 0.1, int(rng.integers(vocab))] = float("nan")
        node_logits[(special >= 0.1) & (special < 0.15)] = float("-inf")
        spare = 3 + t                                          # rows the walk must not mix up
        wide = torch.randn(t + spare, vocab + 5).to(dtype)
        rows = rng.permutation(t + spare)[:t]
        wide[torch.from_numpy(rows), :vocab] = node_logits.to(dtype)
        logits = wide[:, :vocab]                               # row stride vocab + 5
        width = int(tree.depth.max()) + 1 if case % 2 else int(rng.integers(1, 4))
        res = greedy_walk(tree, logits, width, rows)
        emitted, nodes, count = _argmax_first_walk(tree, logits, torch.from_numpy(rows), width)
        assert res.emitted.tolist() == emitted.tolist()
        assert res.accepted_nodes.tolist() == nodes.tolist()
        assert res.num_emitted.tolist() == count.tolist()


def _hard_rows(rng, vocab: int) -> torch.Tensor:
    """Rows that test an argmax's tie and NaN rule: few distinct values (many exact ties), +0 and
    -0, all -inf rows, a NaN at the first, last and a random index, two NaNs, one large value in
    the tail past the last 16-wide block."""
    rows = [torch.from_numpy(rng.integers(-2, 3, size=(24, vocab)).astype(np.float32))]
    signed_zero = torch.zeros(2, vocab)
    signed_zero[0, ::2] = -0.0
    signed_zero[1, 1::2] = -0.0
    rows.append(signed_zero)
    rows.append(torch.full((1, vocab), float("-inf")))
    for at in {0, vocab - 1, int(rng.integers(vocab))}:
        r = torch.randn(1, vocab)
        r[0, at] = float("nan")
        rows.append(r)
    two = torch.randn(1, vocab)
    two[0, [vocab // 2, vocab - 1]] = float("nan")
    rows.append(two)
    tail = torch.randn(1, vocab)
    tail[0, -1] = 100.0
    rows.append(tail)
    rows.append(torch.randn(8, vocab) * 4)
    return torch.cat(rows)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("portable", [False, True])
def test_row_argmax_is_torch_argmax(dtype, portable):
    """The walk's row argmax (the SIMD kernel this CPU dispatches to, and the portable loop) is
    torch.argmax bitwise: first index of the largest, the first NaN wins, ties across SIMD lanes
    and blocks, rows shorter than a block, the scalar tail after the last block."""
    from vllm_treespec.native import native

    rng = np.random.default_rng(11)
    for vocab in [*range(1, 41), 1003, 49152]:
        rows = _hard_rows(rng, vocab).to(dtype)
        buf = rows.view(torch.uint16).numpy() if dtype == torch.bfloat16 else rows.numpy()
        got = native().row_argmax(buf, dtype == torch.bfloat16, portable)
        assert got.tolist() == torch.argmax(rows.float(), dim=-1).tolist(), vocab


def test_walk_falls_back_to_greedy_tokens_for_other_dtypes():
    """float16 (or rows that are not contiguous) take the argmax of every row first: same result."""
    rng = np.random.default_rng(3)
    tree = random_tree_batch(rng, [5, 9, 1], 11)
    logits = biased_logits(rng, tree, 11, follow=0.8, boost=5.0)
    width = int(tree.depth.max()) + 1
    expected = greedy_walk(tree, logits, width)
    for other in (logits.to(torch.float16).to(torch.float32).to(torch.float16), logits.t().contiguous().t()):
        res = greedy_walk(tree, other, width)
        ref = greedy_walk(tree, other.to(torch.float32).contiguous(), width)
        assert res.emitted.tolist() == ref.emitted.tolist()
    assert expected.emitted.shape == (3, width)
    rows = np.arange(logits.shape[0])[::-1].copy()          # float16 rows named in another order
    half = logits.to(torch.float16)
    res = greedy_walk(tree, half.flip(0), width, rows)
    assert res.emitted.tolist() == greedy_walk(tree, half.to(torch.float32), width).emitted.tolist()


def test_walk_names_a_logits_row_out_of_range():
    rng = np.random.default_rng(5)
    tree = random_tree_batch(rng, [3], 6)
    with pytest.raises(ValueError, match="names logits row 9 of 4"):
        greedy_walk(tree, torch.randn(4, 6), 3, np.array([0, 1, 9]))


def test_the_greedy_walk_benchmark_runs(tmp_path):
    """benchmarks/bench_greedy_walk.py (the committed record's script) on a tiny grid; it checks
    that both forms emit accepted + 1 tokens per request."""
    import json

    from benchmark_modules import load_benchmark

    out = tmp_path / "greedy.json"
    load_benchmark("bench_greedy_walk").main(["--batch", "2", "--nodes", "3", "--accepted", "0", "3",
                                              "--vocab", "300", "--calls", "4", "--rounds", "1",
                                              "--output", str(out)])
    rows = json.loads(out.read_text())["results"]
    assert {(r["dtype"], r["accepted"]) for r in rows} == {(d, a) for d in ("float32", "bfloat16") for a in (0, 3)}
    assert all(r["every_row_ms"] > 0 and r["visited_rows_ms"] > 0 for r in rows)
