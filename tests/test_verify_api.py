"""accept(): the TreeBatch contract, reproducibility, batch independence, clear errors, bench smoke."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from harness.accept_latency import accept_latency
from support.verify_cases import random_tree_batch
from vllm_treespec.tree import TreeBatch
from vllm_treespec.verify import SamplingParamsBatch, accept, greedy_walk

pytestmark = pytest.mark.usefixtures("one_torch_thread")


VOCAB = 10


def _setup(seed: int, sizes):
    rng = np.random.default_rng(seed)
    tree = random_tree_batch(rng, sizes, VOCAB)
    # Peaked target rows on a child so walks go deep; draft rows close to the target.
    logits = torch.tensor(rng.normal(0, 1, (len(tree.tokens), VOCAB)), dtype=torch.float32)
    offsets = tree.offsets.tolist()
    for b in range(len(sizes)):
        for i in range(offsets[b] + 1, offsets[b + 1]):
            logits[offsets[b] + int(tree.parents[i]), int(tree.tokens[i])] += 1.5
    draft = torch.softmax(logits + torch.tensor(rng.normal(0, 0.5, logits.shape)).float(), -1)
    n = len(sizes)
    params = SamplingParamsBatch.from_lists(
        rng.choice([0.0, 0.6, 1.0, 1.4], n).tolist(),
        rng.choice([0, 3, 6], n).tolist(),
        rng.choice([1.0, 0.9, 0.6], n).tolist(),
        rng.choice([0.0, 0.1], n).tolist(),
    )
    return tree, logits, draft, params


def _slice_request(tree, logits, draft, b):
    lo, hi = int(tree.offsets[b]), int(tree.offsets[b + 1])
    sub = TreeBatch.from_arrays([0, hi - lo], tree.tokens[lo:hi], tree.parents[lo:hi])
    return sub, logits[lo:hi], draft[lo:hi]


MODES = [
    ("target_only", None),
    ("rrs", False),
    ("rrs", True),
]


def _children_counts(tree) -> torch.Tensor:
    """Children per node: the draws each node made when every child is one draw (node_draws)."""
    offsets, parents = tree.offsets, tree.parents
    base = torch.repeat_interleave(offsets[:-1], offsets[1:] - offsets[:-1])
    counts = torch.zeros(parents.numel(), dtype=torch.int64)
    draft = parents >= 0
    counts.index_add_(0, (parents + base)[draft], torch.ones(int(draft.sum()), dtype=torch.int64))
    return counts


def _run(tree, logits, draft, params, mode, repl, gens):
    return accept(
        tree, logits, mode=mode, sampling=params, generators=gens,
        draft_probs=draft if mode == "rrs" else None, replacement=repl,
        node_draws=_children_counts(tree) if repl else None,
    )


@pytest.mark.parametrize("mode,repl", MODES)
def test_seeded_requests_reproduce(mode, repl):
    tree, logits, draft, params = _setup(1, [12, 20, 7, 15])
    seeds = lambda s: [torch.Generator().manual_seed(s + b) for b in range(4)]
    a = _run(tree, logits, draft, params, mode, repl, seeds(100))
    b = _run(tree, logits, draft, params, mode, repl, seeds(100))
    assert torch.equal(a.emitted, b.emitted) and torch.equal(a.accepted_nodes, b.accepted_nodes)
    outcomes = {
        tuple(_run(tree, logits, draft, params, mode, repl, seeds(s)).emitted.view(-1).tolist())
        for s in range(0, 400, 40)
    }
    assert len(outcomes) > 1  # the seed matters


@pytest.mark.parametrize("mode,repl", MODES)
def test_request_result_independent_of_batch(mode, repl):
    tree, logits, draft, _ = _setup(2, [9, 25, 14, 1, 30, 11])
    # Seeded requests 1, 2, 4 sample with different filters; the others differ in kind.
    params = SamplingParamsBatch.from_lists(
        [0.0, 0.8, 1.2, 1.0, 0.7, 1.0], [0, 3, 0, 0, 5, 0], [1.0, 0.9, 1.0, 0.5, 0.8, 1.0],
        [0.0, 0.0, 0.1, 0.0, 0.05, 0.0],
    )
    seeds = {1: 7, 2: 42, 4: 8}
    gens = [torch.Generator().manual_seed(seeds[b]) if b in seeds else None for b in range(6)]
    full = _run(tree, logits, draft, params, mode, repl, gens)
    for b, seed in seeds.items():
        sub_tree, sub_logits, sub_draft = _slice_request(tree, logits, draft, b)
        alone = _run(sub_tree, sub_logits, sub_draft, params.rows(torch.tensor([b])), mode, repl,
                     [torch.Generator().manual_seed(seed)])
        width = alone.emitted.shape[1]
        assert torch.equal(full.emitted[b, :width], alone.emitted[0])
        assert (full.emitted[b, width:] == -1).all()
        assert torch.equal(full.accepted_nodes[b, :width], alone.accepted_nodes[0])


@pytest.mark.parametrize("mode", ["target_only", "rrs", "root_only"])
def test_generator_advances_by_a_fixed_block(mode):
    """Two coins per node in every mode (verify/coins.py), so a seeded request's stream moves
    the same whichever rule its batch needs."""
    tree, logits, draft, params = _setup(3, [6, 9])
    params = SamplingParamsBatch.from_lists([1.0, 1.0])
    g = torch.Generator().manual_seed(5)
    if mode == "root_only":
        roots = TreeBatch.root_only([1, 2])
        accept(roots, logits[:2], mode="target_only", sampling=params, generators=[g, None],
               coin_rows=6)
    else:
        accept(tree, logits, mode=mode, sampling=params, generators=[g, None],
               draft_probs=draft if mode == "rrs" else None,
               replacement=False if mode == "rrs" else None)
    ref = torch.Generator().manual_seed(5)
    torch.rand((6, 2), dtype=torch.float64, generator=ref)  # 2 coins per node of request 0
    assert torch.equal(g.get_state(), ref.get_state())


def test_given_or_derived_depth_agree():
    """A batch built from lists and arrays with its depth given accepts as one whose depth was
    derived from the parents (a greedy and a sampled request)."""
    tree, logits, _, _ = _setup(4, [8, 5])
    forms = [tree, TreeBatch.from_arrays(tree.offsets.tolist(), tree.tokens.numpy(), tree.parents.tolist(),
                                         tree.depth.tolist())]
    params = SamplingParamsBatch.from_lists([0.0, 1.0])
    results = [accept(f, logits, mode="target_only", sampling=params,
                      generators=[None, torch.Generator().manual_seed(3)]).emitted for f in forms]
    assert all(torch.equal(r, results[0]) for r in results)


def _tiny():
    tree = {"offsets": torch.tensor([0, 3]), "tokens": torch.tensor([4, 1, 2]),
            "parents": torch.tensor([-1, 0, 0])}     # TreeBatch.from_arrays keywords
    return tree, torch.randn(3, 5), torch.full((3, 5), 0.2)


@pytest.mark.parametrize(
    "change,kwargs,error,match",
    [
        ({}, {"mode": "beam"}, ValueError, "unknown acceptance mode"),
        ({"logits": torch.randn(4, 5)}, {}, ValueError, "logits has 4 rows"),
        ({"logits": torch.randn(3)}, {}, ValueError, "2-D"),
        ({"offsets": torch.tensor([1, 3])}, {}, ValueError, "start at 0"),
        ({"offsets": torch.tensor([0, 3, 3])}, {}, ValueError, "at least its root"),
        ({"parents": torch.tensor([0, 0, 0])}, {}, ValueError, "invalid parent"),
        ({"parents": torch.tensor([-1, 0, 2])}, {}, ValueError, "invalid parent"),
        ({"parents": torch.tensor([-1, -1, 0])}, {}, ValueError, "invalid parent"),
        ({"parents": torch.tensor([-1, 0])}, {}, ValueError, "parents has 2"),
        ({"tokens": torch.tensor([4, 1, 9])}, {}, ValueError, "outside the vocabulary"),
        ({"tokens": torch.tensor([4, 1, 1])}, {}, ValueError, "distinct"),
        ({"tokens": torch.tensor([4.0, 1.0, 2.0])}, {}, TypeError, "integers"),
        ({"depth": torch.tensor([0, 1, 2])}, {}, ValueError, "depth disagrees"),
        ({}, {"mode": "rrs", "replacement": False}, ValueError, "needs draft_probs"),
        ({}, {"mode": "rrs", "draft": True}, ValueError, "replacement=True"),
        ({}, {"mode": "rrs", "replacement": False, "draft": torch.full((3, 4), 0.25)},
         ValueError, r"shape \[T, V\]"),
        ({}, {"mode": "rrs", "replacement": False, "draft": torch.randn(3, 5)},
         ValueError, "negative|sums to"),
        ({}, {"mode": "rrs", "replacement": False, "draft": torch.full((3, 5), 0.3)},
         ValueError, "sums to"),
        ({}, {"mode": "rrs", "replacement": False,
              "draft": torch.tensor([[0.5, 0.0, 0.5, 0.0, 0.0]] * 3)},
         ValueError, "zero probability"),
        ({}, {"mode": "rrs", "replacement": False, "draft": True,
              "num_draws": torch.tensor([1, 2, 1])}, ValueError, "replacement=True"),
        ({}, {"mode": "target_only", "num_draws": torch.tensor([1, 1, 1])},
         ValueError, "only used"),
        ({}, {"mode": "target_only", "node_draws": torch.tensor([2, 0, 0])},
         ValueError, "only used"),
        ({}, {"mode": "rrs", "replacement": False, "draft": True,
              "node_draws": torch.tensor([2, 0, 0])}, ValueError, "only used"),
        ({}, {"mode": "rrs", "replacement": True, "draft": True}, ValueError, "needs node_draws"),
        ({}, {"mode": "rrs", "replacement": True, "draft": True,
              "node_draws": torch.tensor([2.0, 0.0, 0.0])}, ValueError, r"node_draws must be"),
        # the root made 3 draws, its two children stand for 2: cut after merging
        ({}, {"mode": "rrs", "replacement": True, "draft": True,
              "node_draws": torch.tensor([3, 0, 0])}, ValueError, "made 3 i.i.d. draws"),
        ({}, {"mode": "rrs", "replacement": True, "draft": True, "num_draws": torch.tensor([1, 2, 2]),
              "node_draws": torch.tensor([3, 0, 0])}, ValueError, "stand for 4"),
        ({}, {"mode": "target_only", "draft_rows": torch.tensor([0, -1, -1])},
         ValueError, "draft_rows is only used"),
        ({}, {"mode": "rrs", "replacement": False, "draft": torch.full((1, 5), 0.2),
              "draft_rows": torch.tensor([0, -1])}, ValueError, r"draft_rows must be .*shape \[3\]"),
        ({}, {"mode": "rrs", "replacement": False, "draft": torch.full((1, 5), 0.2),
              "draft_rows": torch.tensor([1, -1, -1])}, ValueError, r"-1 or a row of draft_probs"),
        ({}, {"mode": "rrs", "replacement": False, "draft": torch.full((1, 4), 0.25),
              "draft_rows": torch.tensor([0, -1, -1])}, ValueError, r"shape \[M, V\]"),
        ({}, {"mode": "rrs", "replacement": False,
              "draft": torch.tensor([[0.5, 0.0, 0.5, 0.0, 0.0]]),
              "draft_rows": torch.tensor([0, -1, -1])}, ValueError, "zero probability"),
        ({}, {"mode": "target_only", "generators": [None, None]}, ValueError, "generators has 2"),
        ({}, {"mode": "target_only", "sampling": SamplingParamsBatch.from_lists([1.0, 1.0])},
         ValueError, r"shape \[1\]"),
        ({}, {"max_depth": 0}, ValueError, "max_depth"),
    ],
)
def test_bad_input_errors(change, kwargs, error, match):
    tree, logits, draft = _tiny()
    logits = change.pop("logits", logits)
    tree = {**tree, **change}
    kwargs = dict(kwargs)
    if kwargs.get("draft") is True:
        kwargs["draft"] = draft
    if "draft" in kwargs:
        kwargs["draft_probs"] = kwargs.pop("draft")
    with pytest.raises(error, match=match):
        accept(TreeBatch.from_arrays(**tree), logits, **kwargs)


def test_acceptance_takes_the_tree_batch_only():
    """One tree contract: anything but a TreeBatch is refused with the type to use."""
    for not_a_batch in (SimpleNamespace(offsets=[0, 1], tokens=[3], parents=[-1]),
                        ([0, 1], [3], [-1]), {"offsets": [0, 1], "tokens": [3], "parents": [-1]}):
        with pytest.raises(TypeError, match="TreeBatch"):
            accept(not_a_batch, torch.randn(1, 5))
        with pytest.raises(TypeError, match="TreeBatch"):
            greedy_walk(not_a_batch, torch.randn(1, 5), 1)


def test_bench_smoke():
    out = accept_latency(batch_sizes=(1, 3), nodes=10, vocab=50, repeats=1)
    assert set(out["results"]) == {"greedy", "target_only", "rrs"}
    for per_mode in out["results"].values():
        assert set(per_mode) == {1, 3}
        assert all(v["median_ms"] > 0 and v["mean_emitted"] >= 1 for v in per_mode.values())


@pytest.mark.parametrize("seed", range(4))
def test_root_only_batches_sample_as_the_walk_does(seed):
    """A step in which no request drafted takes accept()'s root-only path; each seeded request
    must get the token (and leave its generator where) the full walk would, which the walk
    shows when a drafted request joins the batch; the greedy request 0 gets the greedy walk's
    token (the walk hands it over)."""
    mode = "target_only"
    rng = np.random.default_rng(seed)
    n = 5
    logits = torch.tensor(rng.normal(0, 2, (n, VOCAB)), dtype=torch.float32)
    params = SamplingParamsBatch.from_lists([0.0, 0.7, 1.0, 1.3, 0.9], [0, 3, 0, 5, 0],
                                            [1.0, 0.9, 0.6, 1.0, 1.0], [0.0, 0.0, 0.1, 0.0, 0.05])
    roots = TreeBatch.root_only(torch.tensor(rng.integers(0, VOCAB, n)))
    extra = random_tree_batch(rng, [6], VOCAB)
    mixed = TreeBatch.from_arrays(torch.cat([roots.offsets, n + extra.offsets[1:]]),
                                  torch.cat([roots.tokens, extra.tokens]),
                                  torch.cat([roots.parents, extra.parents]))
    mixed_logits = torch.cat([logits, torch.tensor(rng.normal(0, 2, (6, VOCAB)), dtype=torch.float32)])
    mixed_params = SamplingParamsBatch.from_lists([0.0, 0.7, 1.0, 1.3, 0.9, 1.0], [0, 3, 0, 5, 0, 0],
                                                  [1.0, 0.9, 0.6, 1.0, 1.0, 1.0],
                                                  [0.0, 0.0, 0.1, 0.0, 0.05, 0.0])
    gens = lambda: [torch.Generator().manual_seed(100 * seed + b) for b in range(n)]
    alone_gens, mixed_gens = gens(), gens()
    alone = accept(roots, logits.clone(), mode=mode, sampling=params, generators=alone_gens,
                   max_depth=3, coin_rows=8)
    walked = accept(mixed, mixed_logits.clone(), mode=mode, sampling=mixed_params,
                    generators=mixed_gens + [torch.Generator().manual_seed(1)], max_depth=5, coin_rows=8)
    assert alone.emitted.shape == (n, 4) and (alone.emitted[:, 1:] == -1).all()
    assert torch.equal(alone.emitted[:, 0], walked.emitted[:n, 0])
    assert torch.equal(alone.num_emitted, torch.ones(n, dtype=torch.int64))
    assert (alone.accepted_nodes == -1).all() and (alone.accepted_rows == -1).all()
    for a, b in zip(alone_gens, mixed_gens):
        assert torch.equal(a.get_state(), b.get_state())


@pytest.mark.parametrize("kwargs, logits_rows, match", [
    ({}, 3, "logits has 3 rows but the tree batch has 2 nodes"),
    ({"mode": "target_only", "generators": [None]}, 2, "generators has 1 entries"),
    ({"max_depth": -1}, 2, "max_depth=-1"),
])
def test_root_only_bad_input_errors(kwargs, logits_rows, match):
    roots = TreeBatch.root_only([1, 2])
    with pytest.raises(ValueError, match=match):
        accept(roots, torch.randn(logits_rows, VOCAB), **kwargs)


def test_root_only_path_still_validates_the_tree():
    """A batch that only looks root-only (a root with a parent) gets TreeBatch.check's error."""
    bad = TreeBatch(torch.tensor([0, 1, 2]), torch.tensor([1, 2]), torch.tensor([-1, 0]),
                    torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="invalid parent 0 at request 1"):
        accept(bad, torch.randn(2, VOCAB), mode="target_only")


def test_verify_never_imports_the_engine_or_vllm():
    """verify/ decides acceptance and compaction moves below the engine: importing all of it
    pulls in neither vLLM nor vllm_treespec.engine (nor Triton, which only the CUDA path loads)."""
    import subprocess
    import sys

    code = ("import sys, pkgutil, importlib, vllm_treespec.verify as v;"
            "[importlib.import_module('vllm_treespec.verify.' + m.name) "
            " for m in pkgutil.iter_modules(v.__path__) if m.name != 'testing'];"
            "print([m for m in sys.modules if m.split('.')[0] in ('vllm', 'triton')"
            " or m.startswith('vllm_treespec.engine')])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
