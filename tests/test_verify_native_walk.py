"""The native sampled walk (csrc/verify/sampled_walk.cpp) against the torch walk it replaces on
the host: the same tokens for the same coins wherever the coin is not within float rounding of
a CDF step, the same accepted paths, the same errors, and root-only steps that draw exactly
what the walk draws."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from support.verify_cases import distinct_sibling_trees
from vllm_treespec.verify import SamplingParamsBatch, accept_target_only
from vllm_treespec.tree import TreeBatch
from vllm_treespec.verify.accept import _target_only_torch
from vllm_treespec.verify.rules import draw_target_tokens, draw_target_tokens_torch
from vllm_treespec.verify.sampling_params import process_logits

VOCAB = 97


def _params(n: int, rng: np.random.Generator, greedy: bool = True) -> SamplingParamsBatch:
    """A mix of every filter (and greedy rows unless greedy=False), one entry per row."""
    kinds = rng.integers(0 if greedy else 1, 6, n)
    temperature = np.where(kinds == 0, 0.0, rng.uniform(0.3, 1.5, n))
    top_k = np.where(kinds == 2, rng.integers(1, VOCAB + 5, n), np.where(kinds == 5, 7, 0))
    top_p = np.where(np.isin(kinds, (3, 5)), rng.uniform(0.2, 0.99, n), 1.0)
    min_p = np.where(kinds == 4, rng.uniform(0.01, 0.5, n), 0.0)
    return SamplingParamsBatch.from_lists(temperature.tolist(), top_k.tolist(), top_p.tolist(),
                                          min_p.tolist())


def _near_a_step(logits: torch.Tensor, params: SamplingParamsBatch, coins: torch.Tensor,
                 tol: float = 1e-5) -> torch.Tensor:
    """bool [N]: the coin lands within `tol` (relative) of a CDF step of the torch-processed row,
    where float rounding may pick the neighbouring token."""
    probs = torch.softmax(process_logits(logits, params), dim=-1).to(torch.float64)
    cdf = probs.cumsum(dim=1)
    target = coins.unsqueeze(1) * cdf[:, -1:]
    return ((cdf - target).abs() / cdf[:, -1:]).min(dim=1).values < tol


def test_row_draws_match_torch_away_from_cdf_steps() -> None:
    rng = np.random.default_rng(0)
    n = 4000
    logits = torch.from_numpy(rng.normal(0, 3, (n, VOCAB)).astype(np.float32))
    logits[:50, :3] = logits[:50, 3:6]             # ties, for top-k and top-p
    params = _params(n, rng, greedy=False)
    coins = torch.from_numpy(rng.random(n))
    native = draw_target_tokens(logits, params, coins)
    torch_ = draw_target_tokens_torch(logits.clone(), params, coins)
    compared = ~_near_a_step(logits, params, coins)
    assert int(compared.sum()) > 0.99 * n
    mismatch = (native != torch_) & compared
    assert not bool(mismatch.any()), f"rows {mismatch.nonzero().squeeze(1)[:10].tolist()} differ"


def test_row_draws_refuse_greedy_rows() -> None:
    """The greedy rule has one implementation on the host (the greedy walk)."""
    with pytest.raises(ValueError, match="greedy walk"):
        draw_target_tokens(torch.zeros(1, VOCAB), SamplingParamsBatch.from_lists([0.0]),
                           torch.zeros(1, dtype=torch.float64))


def test_row_draws_follow_the_processed_distribution() -> None:
    """Many coins on one row with every filter on: token frequencies match the target."""
    rng = np.random.default_rng(1)
    logits = torch.from_numpy(rng.normal(0, 2, (1, VOCAB)).astype(np.float32))
    params = SamplingParamsBatch.from_lists([0.8], [40], [0.9], [0.02])
    n = 60_000
    coins = torch.from_numpy(rng.random(n))
    tokens = draw_target_tokens(logits.expand(n, VOCAB).contiguous(),
                                SamplingParamsBatch(*(f.expand(n) for f in (
                                    params.temperature, params.top_k, params.top_p,
                                    params.min_p))), coins)
    p = torch.softmax(process_logits(logits, params), dim=-1)[0].double()
    counts = torch.bincount(tokens, minlength=VOCAB).double()
    assert bool((counts[p == 0] == 0).all())                  # filtered tokens never drawn
    keep = p * n >= 5
    chi2 = float((((counts - p * n) ** 2) / (p * n))[keep].sum())
    dof = int(keep.sum()) - 1
    assert chi2 < dof + 6 * (2 * dof) ** 0.5


def _random_trees(rng: np.random.Generator, num_requests: int) -> tuple[torch.Tensor, ...]:
    return distinct_sibling_trees(rng, num_requests, VOCAB)


def test_walk_matches_the_torch_walk() -> None:
    rng = np.random.default_rng(2)
    agree = 0
    for trial in range(30):
        tree = _random_trees(rng, 24)
        t = tree.tokens.numel()
        # peaked rows, so walks go deep: the drafted child is often the likely token
        logits = torch.from_numpy(rng.normal(0, 1, (t, VOCAB)).astype(np.float32))
        parents = tree.parents
        for child in range(t):
            if int(parents[child]) >= 0:
                start = int(tree.offsets[tree.offsets <= child][-1])
                logits[start + int(parents[child]), tree.tokens[child]] += 4.0
        params = _params(24, rng)
        seeds = [trial * 100 + b for b in range(24)]
        native = accept_target_only(tree, logits, params,
                                    [torch.Generator().manual_seed(s) for s in seeds])
        reference = _target_only_torch(tree, logits.clone(), params,
                                       [torch.Generator().manual_seed(s) for s in seeds], None,
                                       None)
        same = (native.emitted == reference.emitted).all(dim=1)
        agree += int(same.sum())
        assert torch.equal(native.num_emitted[same], reference.num_emitted[same])
        assert torch.equal(native.accepted_nodes[same], reference.accepted_nodes[same])
        assert torch.equal(native.accepted_rows[same], reference.accepted_rows[same])
        assert int(native.num_accepted.max()) >= 1
    assert agree >= 0.99 * 30 * 24


def test_root_only_steps_draw_what_the_walk_draws() -> None:
    """A request's first token is the same whether its batch is all root-only trees (the
    shortcut) or it sits next to a drafted tree (the walk)."""
    rng = np.random.default_rng(3)
    logits = torch.from_numpy(rng.normal(0, 2, (4, VOCAB)).astype(np.float32))
    params = SamplingParamsBatch.from_lists([0.7, 1.0, 0.0, 0.9], [0, 5, 0, 0], [1.0, 1.0, 1.0, 0.8])
    roots = TreeBatch.root_only(torch.zeros(4, dtype=torch.int64))
    alone = accept_target_only(roots, logits, params,
                               [torch.Generator().manual_seed(s) for s in range(4)], max_depth=2)
    mixed_tree = TreeBatch.from_arrays([0, 1, 2, 3, 6], [0, 0, 0, 0, 5, 6], [-1, -1, -1, -1, 0, 0])
    mixed_logits = torch.cat([logits, torch.zeros(2, VOCAB)])
    mixed = accept_target_only(mixed_tree, mixed_logits, params,
                               [torch.Generator().manual_seed(s) for s in range(4)], max_depth=2)
    assert torch.equal(alone.emitted[:3, 0], mixed.emitted[:3, 0])
    assert torch.equal(alone.emitted[:, 0], _target_only_torch(
        roots, logits.clone(), params,
        [torch.Generator().manual_seed(s) for s in range(4)], 2, None).emitted[:, 0])


@pytest.mark.parametrize("tree, message", [
    ((torch.tensor([0, 2]), torch.tensor([0, 5]), torch.tensor([-1, 1])), "invalid parent"),
    ((torch.tensor([0, 3]), torch.tensor([0, 5, 5]), torch.tensor([-1, 0, 0])),
     "two children with token 5"),
    ((torch.tensor([0, 2]), torch.tensor([0, VOCAB]), torch.tensor([-1, 0])),
     "outside the vocabulary"),
    ((torch.tensor([0, 2]), torch.tensor([0, 5]), torch.tensor([-1, 0]), torch.tensor([0, 2])),
     "depth disagrees"),
])
def test_bad_trees_are_named_as_before(tree: tuple, message: str) -> None:
    logits = torch.zeros(tree[1].numel(), VOCAB)
    with pytest.raises(ValueError, match=message):
        accept_target_only(TreeBatch.from_arrays(*tree), logits, SamplingParamsBatch.from_lists([0.7]))


def test_bad_parameters_and_max_depth_are_named() -> None:
    tree = TreeBatch.from_arrays([0, 2], [0, 5], [-1, 0])
    logits = torch.zeros(2, VOCAB)
    with pytest.raises(ValueError, match="sampling.top_p"):
        accept_target_only(tree, logits, SamplingParamsBatch.from_lists([0.7], top_p=[1.5]))
    with pytest.raises(TypeError, match="top_k must hold integers"):
        accept_target_only(tree, logits, SamplingParamsBatch(
            torch.tensor([0.7]), torch.tensor([3.0]), torch.tensor([1.0]), torch.tensor([0.0])))
    with pytest.raises(ValueError, match="smaller than the deepest node"):
        accept_target_only(tree, logits, SamplingParamsBatch.from_lists([0.7]), max_depth=0)
    with pytest.raises(ValueError, match="generators has 2 entries"):
        accept_target_only(tree, logits, SamplingParamsBatch.from_lists([0.7]),
                           [torch.Generator(), torch.Generator()])


def test_the_walk_benchmark_runs(tmp_path) -> None:
    """benchmarks/bench_sampled_walk.py (the committed record's script) on a tiny grid."""
    import json

    from benchmark_modules import load_benchmark

    out = tmp_path / "walk.json"
    load_benchmark("bench_sampled_walk").main(["--batch", "2", "--nodes", "1", "4", "--calls", "3",
                                               "--rounds", "1", "--output", str(out)])
    rows = json.loads(out.read_text())["results"]
    assert {(r["nodes"], r["seeded"]) for r in rows} == {(1, False), (1, True), (4, False), (4, True)}
    assert all(r["native_ms"] > 0 and r["torch_ms"] > 0 for r in rows)
