"""Lockstep tree building (tree/lockstep.py): many requests, one batched expansion per round,
exactly the trees of the synchronous builders run one request at a time."""
from __future__ import annotations

import inspect
import pickle
import re

import numpy as np
import pytest
import torch

from harness.random_trees import hashed_expander, random_depth_table, random_ngram
from vllm_treespec.tree import BuildError, CandidateError, DepthTable, Expander, build_tree
from vllm_treespec.tree.builders import builder_params
from vllm_treespec.tree.lockstep import (LOCKSTEP_BUILDERS, ExpandRequest, Expansion,
                                         builder_steps, run_lockstep)

VOCAB = 30
CONTEXT = (1, 2, 3)


def random_params(rng: np.random.Generator, builder: str) -> dict:
    if builder == "static":
        return dict(template=tuple(int(f) for f in rng.integers(1, 5, size=rng.integers(1, 6))))
    if builder == "threshold":
        return dict(branch=int(rng.integers(1, 5)), max_depth=int(rng.integers(0, 7)),
                    tau=float(rng.choice([1e-4, 0.01, 0.1, 0.5])))
    if builder == "chain":
        return {} if rng.random() < 0.3 else dict(max_depth=int(rng.integers(0, 9)))
    depth = int(rng.integers(0, 6))
    topk = (int(rng.integers(1, 6)) if rng.random() < 0.5
            else [int(k) for k in rng.integers(1, 6, size=depth)])
    scorer, sp = [("acc_logp", None), ("presto", {"lam": 0.5}), ("dart", None)][rng.integers(3)]
    return dict(topk=topk, max_depth=depth, scorer=scorer, scorer_params=sp,
                greedy_spine=bool(rng.random() < 0.4))


def random_requests(seed: int, n: int):
    """(builder, expander, budget, params) per request; expanders are hashed functions of the
    path (pad: some paths have 0..5 children, so some requests run dry early)."""
    rng = np.random.default_rng(seed)
    rho = random_ngram(np.random.default_rng(seed + 1), vocab=VOCAB)
    out = []
    for i in range(n):
        builder = str(rng.choice(sorted(LOCKSTEP_BUILDERS)))
        exp = hashed_expander(seed * 101 + i, root=int(rng.integers(VOCAB)), vocab=VOCAB,
                              ties=bool(rng.random() < 0.5), pad=bool(rng.random() < 0.25),
                              context=CONTEXT, rho=rho)
        out.append((builder, exp, int(rng.integers(0, 40)), random_params(rng, builder)))
    return out


def same_tree(a, b) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f))
               for f in ("tokens", "parents", "depth", "logprob", "score"))


def node_index(tree, path) -> int:
    """Index of the node at `path` (token tuple after the root) in a DraftTree."""
    v = 0
    for tok in path:
        kids = [c for c in range(tree.num_nodes) if tree.parents[c] == v and tree.tokens[c] == tok]
        assert len(kids) == 1, (path, tok)
        v = kids[0]
    return v


class Recorder:
    """expand_batch over per-request expander functions; records every round."""

    def __init__(self, fns, rng=None):
        self.fns, self.rng, self.rounds = fns, rng, []

    def __call__(self, requests):
        assert requests, "expand_batch called with no requests"
        self.rounds.append(list(requests))
        out = []
        for index, paths, k in requests:
            tok, lp = self.fns[index](paths, k)
            form = self.rng.integers(3) if self.rng is not None else 0
            if form == 1:
                tok, lp = torch.from_numpy(tok), torch.from_numpy(lp)
            elif form == 2:
                tok, lp = tok.tolist(), lp.tolist()
            out.append((tok, lp))
        return out


@pytest.mark.parametrize("seed", range(80))
def test_lockstep_equals_synchronous_builders(seed):
    reqs = random_requests(seed, n=1 + seed % 7)
    sync = []
    for builder, exp, budget, params in reqs:
        sync.append(build_tree(builder, exp, budget, **params))
    gens = [builder_steps(b, e.root, budget, context=e.context, rho=e.rho, **p)
            for b, e, budget, p in reqs]
    rec = Recorder([e.fn for _, e, _, _ in reqs], np.random.default_rng(seed))
    trees = run_lockstep(gens, rec)

    assert len(trees) == len(reqs)
    for t, s in zip(trees, sync):
        assert same_tree(t, s)
    # One expand_batch call per round; rounds = the most expansions any request needs.
    calls = [e.calls for _, e, _, _ in reqs]
    assert len(rec.rounds) == max(calls)
    for i, (builder, exp, budget, params) in enumerate(reqs):
        mine = [r for rnd in rec.rounds for r in rnd if r.index == i]
        assert len(mine) == calls[i]
        # A request takes part in a prefix of the rounds (once per round), never after it ends.
        assert all(any(r.index == i for r in rnd) for rnd in rec.rounds[:calls[i]])
        seen: dict[tuple, int] = {}
        for rnd, r in enumerate(mine):
            assert isinstance(r, ExpandRequest) and r.paths
            assert len(r.node_ids) == len(r.parent_ids) == len(r.paths)
            if builder == "best_first":
                assert len(r.paths) == 1  # one popped node per round
            else:
                assert all(len(p) == rnd for p in r.paths)  # round = level
            for path, v, par in zip(r.paths, r.node_ids, r.parent_ids):
                assert (v == 0) == (path == ()) and (par == -1) == (path == ())
                if path:
                    assert seen[path[:-1]] == par  # the parent was expanded in an earlier round
                assert path not in seen and v not in seen.values()
                seen[path] = v
                idx = node_index(trees[i], path)  # every expanded node is in the tree
                if builder != "best_first":
                    assert idx == v  # creation order = tree order for the level builders


def test_best_first_node_ids_follow_creation_order():
    """Builder ids are Nodes ids: root 0, then children in creation order; a popped node's id
    exceeds its parent's, and ids are not the (pop-ordered) tree indices."""
    exp = hashed_expander(5, root=3, vocab=VOCAB)
    rec = Recorder([exp.fn])
    tree = run_lockstep([builder_steps("best_first", 3, 12, topk=3, max_depth=4)], rec)[0]
    assert same_tree(tree, build_tree("best_first", exp, 12, topk=3, max_depth=4))
    reqs = [r for rnd in rec.rounds for r in rnd]
    assert reqs[0].paths == [()] and reqs[0].node_ids == [0]
    for r in reqs[1:]:
        assert r.node_ids[0] > r.parent_ids[0] >= 0


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("prefetch", [2, 4, 9])
def test_best_first_prefetch_builds_the_same_tree_in_fewer_rounds(seed, prefetch):
    """prefetch=m asks for the next heap nodes' children in the same request: same tree (every
    builder scorer, with and without the greedy spine), rounds never more, each path expanded
    once and only after its parent."""
    rng = np.random.default_rng(seed)
    reqs = []
    for i in range(1 + seed % 4):
        exp = hashed_expander(seed * 13 + i, root=int(rng.integers(VOCAB)), vocab=VOCAB,
                              ties=bool(rng.random() < 0.5), pad=bool(rng.random() < 0.25),
                              context=CONTEXT, rho=random_ngram(np.random.default_rng(seed), vocab=VOCAB))
        reqs.append((exp, int(rng.integers(1, 40)), random_params(rng, "best_first")))

    def run(m):
        gens = [builder_steps("best_first", e.root, b, context=e.context, rho=e.rho, prefetch=m, **p)
                for e, b, p in reqs]
        rec = Recorder([e.fn for e, _, _ in reqs])
        return run_lockstep(gens, rec), rec.rounds

    base, base_rounds = run(1)
    trees, rounds = run(prefetch)
    for (e, b, p), t, want in zip(reqs, trees, base):
        assert same_tree(t, want) and same_tree(t, build_tree("best_first", e, b, **p))
    assert len(rounds) <= len(base_rounds)
    for i, (_, budget, _) in enumerate(reqs):
        seen: set = set()
        for r in (r for rnd in rounds for r in rnd if r.index == i):
            assert 1 <= len(r.paths) <= prefetch
            for path in r.paths:
                assert path not in seen and (not path or path[:-1] in seen)
                seen.add(path)
        assert len(seen - {()}) <= 2 * budget      # a drafter sized for 2 x budget nodes has room


def test_best_first_prefetch_cuts_rounds_on_a_bushy_tree():
    exp = hashed_expander(3, root=1, vocab=VOCAB)
    counts = {}
    for m in (1, 4):
        rec = Recorder([exp.fn])
        run_lockstep([builder_steps("best_first", 1, 32, topk=4, max_depth=8, prefetch=m)], rec)
        counts[m] = len(rec.rounds)
    assert counts[4] * 2 <= counts[1], counts


def test_finished_requests_do_not_stall_the_others():
    long = hashed_expander(1, root=4, vocab=VOCAB)
    dry = Expander(lambda paths, k: (np.full((len(paths), k), -1), np.zeros((len(paths), k))),
                   root=5)
    fns = [long.fn, dry.fn, long.fn, long.fn, long.fn]
    gens = [builder_steps("threshold", 4, 200, branch=2, max_depth=6, tau=1e-9),  # 6 levels
            builder_steps("static", 5, 10),                  # no children: done after round 1
            builder_steps("chain", 4, 0),                    # budget 0: never expands
            builder_steps("best_first", 4, 5, max_depth=0),  # depth 0: never expands
            builder_steps("chain", 4, 2)]                    # done after 2 rounds
    rec = Recorder(fns)
    trees = run_lockstep(gens, rec)
    assert [t.num_draft for t in trees] == [126, 0, 0, 0, 2]
    assert [sorted(r.index for r in rnd) for rnd in rec.rounds] == [
        [0, 1, 4], [0, 4], [0], [0], [0], [0]]
    assert same_tree(trees[0], build_tree("threshold", hashed_expander(1, root=4, vocab=VOCAB),
                                          200, branch=2, max_depth=6, tau=1e-9))


def test_nothing_to_expand_never_calls_expand_batch():
    def boom(requests):
        raise AssertionError("called")

    table = random_depth_table(np.random.default_rng(0), 3, 4)
    gens = [builder_steps("static", 1, 0), builder_steps("threshold", 2, 5, max_depth=0),
            LOCKSTEP_BUILDERS["best_first"](table, 5, backend="python"),
            LOCKSTEP_BUILDERS["best_first"](table, 5)]  # C++ on a DepthTable: no steps either
    trees = run_lockstep(gens, boom)
    assert [t.num_draft for t in trees] == [0, 0, 5, 5]
    assert same_tree(trees[2], build_tree("best_first", table, 5, backend="python"))
    assert same_tree(trees[3], build_tree("best_first", table, 5))
    assert run_lockstep([], boom) == []


def error_of(fn):
    with pytest.raises(BuildError) as e:
        fn()
    return str(e.value)


@pytest.mark.parametrize("builder, budget, params", [
    ("static", 5, dict(template=())),
    ("static", 5, dict(template="321")),
    ("static", 5, dict(template=(2, 0))),
    ("static", 5, dict(template=(2, 2000))),
    ("static", 5, dict(template=(1,) * 300)),
    ("threshold", 5, dict(branch=0)),
    ("threshold", 5, dict(tau=0.0)),
    ("threshold", 5, dict(tau=float("nan"))),
    ("threshold", 5, dict(max_depth=-1)),
    ("chain", 5, dict(max_depth=1000)),
    ("chain", 5, dict(max_depth=2.0)),
    ("best_first", 5, dict(topk=0)),
    ("best_first", 5, dict(topk=[2, 2], max_depth=3)),
    ("best_first", 5, dict(greedy_spine=1)),
    ("best_first", 5, dict(scorer="bogus")),
    ("best_first", 5, dict(scorer="presto", scorer_params={"lam": -1})),
    ("best_first", 5, dict(backend="gpu")),
    ("best_first", 5, dict(backend="cpp")),
    ("best_first", 5, dict(width=3)),  # a beam parameter
    ("best_first", 5, dict(prefetch=0)),
    ("static", 5, dict(bogus=1, other=2)),
    ("chain", -1, {}),
    ("threshold", True, {}),
    ("static", 1 << 17, {}),
])
def test_bad_params_raise_the_builders_error(builder, budget, params):
    exp = hashed_expander(0, root=1)
    want = error_of(lambda: build_tree(builder, exp, budget, **params))
    assert error_of(lambda: builder_steps(builder, 1, budget, **params)) == want


def test_builder_and_candidate_errors():
    for name in ("beam", "nope", None):
        msg = error_of(lambda: builder_steps(name, 1, 5))
        assert "best_first, chain, static, threshold" in msg
    assert "'beam' has no lockstep form" in error_of(lambda: builder_steps("beam", 1, 5))
    assert "root must be a non-negative token id" in error_of(lambda: builder_steps("chain", -3, 5))
    msg = error_of(lambda: builder_steps("best_first", 1, 5, scorer="dart"))
    assert re.search(r"scorer 'dart' needs an n-gram signal: pass rho= to the builder_steps", msg)


def test_step_functions_take_the_builders_parameters():
    for name, steps in LOCKSTEP_BUILDERS.items():
        sig = inspect.signature(steps).parameters.values()
        assert {p.name: p.default for p in sig if p.kind is p.KEYWORD_ONLY} == builder_params(name)


def test_ngram_scorers_read_context_and_rho():
    rho = random_ngram(np.random.default_rng(3), vocab=VOCAB)
    exp = hashed_expander(9, root=7, vocab=VOCAB, context=(4, 5), rho=rho)
    for scorer in ("presto", "dart", "presto_entropy"):
        want = build_tree("best_first", exp, 15, topk=4, max_depth=4, scorer=scorer)
        got = run_lockstep([builder_steps("best_first", 7, 15, context=(4, 5), rho=rho, topk=4,
                                          max_depth=4, scorer=scorer)], Recorder([exp.fn]))[0]
        assert same_tree(got, want)
        other = run_lockstep([builder_steps("best_first", 7, 15, context=(9, 9), rho=rho, topk=4,
                                            max_depth=4, scorer=scorer)], Recorder([exp.fn]))[0]
        assert other.num_draft == 15  # a different context is a different (valid) request


def test_results_are_cleaned_like_expander_expand():
    """-1 padding, duplicates and unsorted rows come out as Expander.expand gives them."""
    def raw(paths, k):
        tok = np.array([[7, -1, 3, 7, 9][:k]] * len(paths))
        lp = np.array([[-2.0, 0.0, -0.5, -0.1, -2.0][:k]] * len(paths))
        return tok, lp

    for builder, params in [("static", dict(template=(5, 5))), ("threshold", dict(branch=5)),
                            ("chain", {}), ("best_first", dict(topk=5, max_depth=3))]:
        want = build_tree(builder, Expander(raw, root=1), 12, **params)
        got = run_lockstep([builder_steps(builder, 1, 12, **params)],
                           lambda reqs: [raw(p, k) for _, p, k in reqs])[0]
        assert same_tree(got, want) and got.num_draft > 0


@pytest.mark.parametrize("bad, match", [
    (lambda reqs: [], r"returned 0 results for 2 requests"),
    (lambda reqs: None, r"returned None results"),
    (lambda reqs: [(np.zeros((len(p), k + 1)), np.zeros((len(p), k + 1))) for _, p, k in reqs],
     r"request 0: expander returned tokens \(1, 4\)"),
    (lambda reqs: [(np.ones((len(p), 1)), np.full((len(p), 1), 0.5)) for _, p, k in reqs],
     r"request 0: expander log-prob 0.5"),
    (lambda reqs: [np.ones((len(p), 1)) for _, p, k in reqs],
     r"request 0 must be a \(tokens, logprobs\) pair"),
])
def test_malformed_batches_raise_and_close_the_generators(bad, match):
    gens = [builder_steps("static", 1, 5, template=(3, 1)), builder_steps("chain", 2, 5)]
    with pytest.raises(CandidateError, match=match):
        run_lockstep(gens, bad)
    for g in gens:
        assert inspect.getgeneratorstate(g) == inspect.GEN_CLOSED


def test_expand_request_is_a_three_tuple_with_node_ids():
    r = ExpandRequest(2, [(), (4,)], 3, [0, 1], [-1, 0])
    index, paths, k = r
    assert (index, paths, k) == (r.index, r.paths, r.k) == (2, [(), (4,)], 3)
    assert r == (2, [(), (4,)], 3) and len(r) == 3
    assert (r.node_ids, r.parent_ids) == ([0, 1], [-1, 0])
    back = pickle.loads(pickle.dumps(r))
    assert back == r and back.node_ids == [0, 1] and back.parent_ids == [-1, 0]
    assert "node_ids=[0, 1]" in repr(r)


def test_generators_can_be_driven_by_hand():
    """The step protocol without run_lockstep: yield Expansion, send cleaned children."""
    exp = hashed_expander(2, root=6, vocab=VOCAB)
    g = builder_steps("static", 6, 8, template=(2, 2))
    req = next(g)
    assert isinstance(req, Expansion) and req == Expansion([()], 2, [0], [-1])
    req = g.send(exp.expand(req.paths, req.k))
    assert req.k == 2 and req.node_ids == [1, 2] and req.parent_ids == [0, 0]
    with pytest.raises(StopIteration) as done:
        g.send(exp.expand(req.paths, req.k))
    assert same_tree(done.value.value, build_tree("static", hashed_expander(2, root=6, vocab=VOCAB),
                                                  8, template=(2, 2)))


def test_depth_table_inputs_unchanged():
    table = random_depth_table(np.random.default_rng(4), 4, 4, rho=random_ngram(
        np.random.default_rng(5)))
    assert isinstance(table, DepthTable)
    for name, params in [("static", dict(template=(3, 2))), ("threshold", dict(tau=0.01)),
                         ("chain", {}), ("best_first", dict(scorer="presto", backend="python"))]:
        gen = LOCKSTEP_BUILDERS[name](table, 9, **params)
        with pytest.raises(StopIteration) as done:
            next(gen)  # a table needs no expansion
        assert same_tree(done.value.value, build_tree(name, table, 9, **params))
