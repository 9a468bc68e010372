"""Builders: valid trees within budget, and each equals an obviously-correct slow reference."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from harness.random_trees import hashed_expander, random_depth_table, random_ngram
from vllm_treespec.tree import (BUILDERS, BuildError, DepthTable, DraftTree, Expander, build_tree,
                                builder_params, make_scorer)

BACKENDS = ("python", "cpp")


# ----------------------------------------------------------------------------- references
def children(cand, path, level, k):
    """[(token, logq)] of a node, by drafter rank."""
    if isinstance(cand, DepthTable):
        m = min(k, int(cand.valid[level]))
        return list(zip(cand.tokens[level, :m].tolist(), cand.logprobs[level, :m].tolist()))
    toks, lps = cand.expand([path], k)[0]
    return list(zip(toks.tolist(), lps.tolist()))


def scalar_increment(cand, scorer, params, level, path, tok, lq):
    """The scorer formulas written out per candidate with scalar floats (module docstring)."""
    if scorer == "acc_logp":
        return lq
    g = cand.rho.logprob(cand.context + (cand.root,) + path, tok)
    if scorer == "presto":
        return lq + params.get("lam", 0.2) * g
    if scorer == "presto_entropy":
        h = float(cand.entropies()[level])
        lam = params.get("beta", 0.4) * h / (h + params.get("C", 1.0))
        return lq + lam * g
    assert scorer == "dart"
    eps = 1e-10
    s_logit = math.log(math.exp(lq) + eps)
    s_ng = math.log(math.exp(g) + eps)
    return (0.9 ** level * s_logit + 0.5 * s_ng) * (level + 1.0) ** -0.7


def brute_force_best_first(cand, budget, depth, k, scorer="acc_logp", params=None):
    """All prefixes of the candidate tree, sorted by (score desc, depth, sibling-position path)."""
    params = params or {}
    found = []

    def visit(path, score, pospath, level):
        if level == depth:
            return
        kids = children(cand, path, level, k)
        incs = [scalar_increment(cand, scorer, params, level, path, t, lq) for t, lq in kids]
        order = sorted(range(len(kids)), key=lambda r: (-incs[r], r))
        for pos, r in enumerate(order):
            s = score + incs[r]
            p = path + (kids[r][0],)
            found.append((-s, level + 1, pospath + (pos,), p))
            visit(p, s, pospath + (pos,), level + 1)

    visit((), 0.0, (), 0)
    found.sort()
    return [f[3] for f in found[:budget]]


def reference_beam(cand, budget, depth, k, width, scorer="acc_logp", params=None,
                   early_stop=False):
    """DART Alg. 1 with the documented tie-breaks and retention key, one candidate at a time."""
    params = params or {}
    root = dict(id=0, path=(), score=0.0, key=math.inf, depth=0, rank=0, parent=-1)
    nodes, beam = [root], [root]
    for level in range(depth):
        if early_stop and len(nodes) - 1 >= budget:
            break
        pool = []
        for p in beam:
            for r, (tok, lq) in enumerate(children(cand, p["path"], level, k)):
                s = p["score"] + scalar_increment(cand, scorer, params, level, p["path"], tok, lq)
                v = dict(id=len(nodes), path=p["path"] + (tok,), score=s, key=min(s, p["key"]),
                         depth=level + 1, rank=r, parent=p["id"])
                nodes.append(v)
                pool.append(v)
        beam = sorted(pool, key=lambda v: (-v["score"], v["rank"], v["parent"]))[:width]
        if not beam:
            break
    kept = sorted(nodes[1:], key=lambda v: (-v["key"], v["depth"], v["rank"], v["parent"]))
    return [v["path"] for v in kept[:budget]]


def reference_threshold(cand, budget, branch, depth, tau):
    out, active = [], [((), 0.0)]
    for level in range(depth):
        new = []
        for path, cum in active:
            for tok, lq in children(cand, path, level, branch):
                if cum + lq < math.log(tau):
                    break
                if len(out) < budget:
                    out.append(path + (tok,))
                    new.append((path + (tok,), cum + lq))
        active = new
    return out


def token_paths(tree: DraftTree):
    return [tree.path_tokens(i) for i in range(1, tree.num_nodes)]


def check_tree(tree: DraftTree, cand, budget: int, max_depth: int | None = None):
    """Valid, within budget, and every node is a real candidate with its drafter log-prob."""
    DraftTree(tree.tokens, tree.parents, tree.depth, tree.logprob, tree.score)  # full validation
    assert tree.num_draft <= budget
    assert tree.root == cand.root
    if max_depth is not None:
        assert tree.num_draft == 0 or tree.max_depth <= max_depth
    for i in range(1, tree.num_nodes):
        path = tree.path_tokens(int(tree.parents[i]))
        kids = dict(children(cand, path, int(tree.depth[i]) - 1, 1024))
        assert int(tree.tokens[i]) in kids
        assert tree.logprob[i] == np.float32(kids[int(tree.tokens[i])])


# ----------------------------------------------------------------------------- strategies
def make_candidates(seed: int, kind: str, depth: int, k: int, ties: bool, pad: bool, rho=None):
    rng = np.random.default_rng(seed)
    if kind == "table":
        return random_depth_table(rng, depth, k, vocab=30, ties=ties, pad=pad, rho=rho)
    return hashed_expander(seed, root=int(rng.integers(30)), vocab=30, ties=ties, pad=pad,
                           context=(1, 2, 3), rho=rho)


seeds = st.integers(0, 2**32 - 1)
PREFIX_CONSISTENT = {
    "static": dict(template=(3, 2, 2, 1)),
    "best_first": dict(topk=3, max_depth=4),
    "beam": dict(width=3, topk=3, max_depth=4),
    "threshold": dict(branch=3, max_depth=4, tau=0.01),
    "chain": dict(max_depth=4),
}


@settings(max_examples=60, deadline=None)
@given(seed=seeds, name=st.sampled_from(sorted(BUILDERS)), kind=st.sampled_from(["table", "exp"]),
       budget=st.integers(0, 40), ties=st.booleans(), pad=st.booleans())
def test_every_builder_returns_a_valid_tree_within_budget(seed, name, kind, budget, ties, pad):
    cand = make_candidates(seed, kind, 4, 4, ties, pad)
    params = dict(PREFIX_CONSISTENT[name])
    if name == "static":
        params["template"] = (3, 2, 2, 1) if kind == "table" else (3, 2, 2, 1, 1)
    tree = build_tree(name, cand, budget, **params)
    check_tree(tree, cand, budget, max_depth=params.get("max_depth", 5))


@settings(max_examples=40, deadline=None)
@given(seed=seeds, name=st.sampled_from(sorted(PREFIX_CONSISTENT)),
       kind=st.sampled_from(["table", "exp"]), budget=st.integers(0, 40), data=st.data())
def test_smaller_budget_gives_the_prefix(seed, name, kind, budget, data):
    """build(budget=n) == build(budget=N).prefix(n): vLLM cutting drafts keeps the best n."""
    cand = make_candidates(seed, kind, 4, 4, ties=data.draw(st.booleans()), pad=False)
    big = build_tree(name, cand, budget, **PREFIX_CONSISTENT[name])
    n = data.draw(st.integers(0, big.num_draft))
    assert build_tree(name, cand, n, **PREFIX_CONSISTENT[name]) == big.prefix(n)


# ----------------------------------------------------------------------------- best_first
@settings(max_examples=60, deadline=None)
@given(seed=seeds, kind=st.sampled_from(["table", "exp"]), depth=st.integers(1, 4),
       k=st.integers(1, 4), budget=st.integers(0, 90), ties=st.booleans(),
       backend=st.sampled_from(BACKENDS))
def test_best_first_equals_brute_force_top_n(seed, kind, depth, k, budget, ties, backend):
    cand = make_candidates(seed, kind, depth, k, ties, pad=False)
    if kind == "exp":
        backend = "python"
    tree = build_tree("best_first", cand, budget, topk=k, max_depth=depth, backend=backend)
    assert token_paths(tree) == brute_force_best_first(cand, budget, depth, k)
    check_tree(tree, cand, budget, depth)


@settings(max_examples=40, deadline=None)
@given(seed=seeds, depth=st.integers(1, 4), k=st.integers(1, 4), budget=st.integers(0, 60),
       lam=st.floats(0.0, 2.0), backend=st.sampled_from(BACKENDS))
def test_best_first_presto_equals_brute_force(seed, depth, k, budget, lam, backend):
    rng = np.random.default_rng(seed)
    ngram = random_ngram(rng, vocab=30, order=3, entries=300)
    cand = random_depth_table(rng, depth, k, vocab=30, rho=ngram)
    tree = build_tree("best_first", cand, budget, topk=k, scorer="presto",
                      scorer_params={"lam": lam}, backend=backend)
    assert token_paths(tree) == brute_force_best_first(cand, budget, depth, k, "presto",
                                                       {"lam": lam})


@settings(max_examples=40, deadline=None)
@given(seed=seeds, kind=st.sampled_from(["table", "exp"]), budget=st.integers(0, 40),
       backend=st.sampled_from(BACKENDS))
def test_greedy_spine_keeps_the_top1_chain(seed, kind, budget, backend):
    cand = make_candidates(seed, kind, 5, 3, ties=False, pad=False)
    backend = backend if kind == "table" else "python"
    tree = build_tree("best_first", cand, budget, topk=3, max_depth=5, greedy_spine=True,
                      backend=backend)
    check_tree(tree, cand, budget, 5)
    chain = token_paths(build_tree("chain", cand, budget, max_depth=5))
    paths = token_paths(tree)
    assert set(chain) <= set(paths)
    best = set(brute_force_best_first(cand, budget, 5, 3))
    rest = [p for p in paths if p not in set(chain)]
    assert set(rest) <= best  # the non-spine nodes are best-first picks
    assert tree.num_draft == min(budget, len(brute_force_best_first(cand, 10**6, 5, 3)))


def test_best_first_is_lazy():
    """A popped node materialises at most two new nodes (its best child, its next sibling)."""
    calls = []
    cand = hashed_expander(7, root=1, vocab=50)
    inner = cand.fn

    def counting(paths, k):
        calls.append(len(paths))
        return inner(paths, k)

    exp = Expander(counting, root=1)
    tree = build_tree("best_first", exp, 20, topk=8, max_depth=6)
    assert tree.num_draft == 20
    assert len(calls) <= 21 and all(n == 1 for n in calls)  # one expansion per popped node


# ----------------------------------------------------------------------------- beam
SCORERS = ("acc_logp", "dart", "presto", "presto_entropy")


@settings(max_examples=60, deadline=None)
@given(seed=seeds, kind=st.sampled_from(["table", "exp"]), depth=st.integers(1, 4),
       k=st.integers(1, 5), width=st.integers(1, 6), budget=st.integers(0, 80),
       scorer=st.sampled_from(SCORERS), ties=st.booleans(), early_stop=st.booleans(),
       backend=st.sampled_from(BACKENDS))
def test_beam_equals_reference(seed, kind, depth, k, width, budget, scorer, ties, early_stop,
                               backend):
    rng = np.random.default_rng(seed + 1)
    ngram = random_ngram(rng, vocab=30, order=3, entries=300)
    cand = make_candidates(seed, kind, depth, k, ties, pad=False, rho=ngram)
    if kind == "exp":
        backend = "python"
        if scorer == "presto_entropy":
            scorer = "presto"  # an Expander's entropy is per node, the reference is per depth
    tree = build_tree("beam", cand, budget, width=width, topk=k, max_depth=depth, scorer=scorer,
                      early_stop=early_stop, backend=backend)
    want = reference_beam(cand, budget, depth, k, width, scorer, early_stop=early_stop)
    assert token_paths(tree) == want
    check_tree(tree, cand, budget, depth)


ALL_TIES = DepthTable([[10, 11], [20, 21], [30, 31]], np.zeros((3, 2)), root=1)
a, b, c, d, e, f = 10, 11, 20, 21, 30, 31


@pytest.mark.parametrize("backend", BACKENDS)
def test_beam_tie_breaks_by_hand(backend):
    """All scores equal: order is rank, then parent id, for the beam and the retention alike."""
    tree = build_tree("beam", ALL_TIES, 100, width=2, topk=2, backend=backend)
    # Beam after level 2 is [a->c, b->c] (rank 0 from both parents beats rank 1 of the first).
    assert token_paths(tree) == [
        (a,), (b,),
        (a, c), (b, c), (a, d), (b, d),
        (a, c, e), (b, c, e), (a, c, f), (b, c, f)]
    assert token_paths(tree) == reference_beam(ALL_TIES, 100, 3, 2, 2)


@pytest.mark.parametrize("backend", BACKENDS)
def test_best_first_tie_breaks_by_hand(backend):
    """All scores equal: depth, then sibling-position path (lexicographic)."""
    tree = build_tree("best_first", ALL_TIES, 9, backend=backend)
    assert token_paths(tree) == [(a,), (b,), (a, c), (a, d), (b, c), (b, d),
                                 (a, c, e), (a, c, f), (a, d, e)]
    spine = build_tree("best_first", ALL_TIES, 4, greedy_spine=True, backend=backend)
    assert token_paths(spine) == [(a,), (b,), (a, c), (a, c, e)]


def test_beam_closure_with_increasing_scores():
    """A scorer that rewards depth (positive increments) still yields an ancestor-closed tree."""

    class Rising:
        needs_rho = False

        def increments(self, level, logq, logrho, entropy):
            return np.asarray(logq) + 5.0 * (level + 1)

    cand = random_depth_table(np.random.default_rng(3), 4, 5)
    tree = build_tree("beam", cand, 7, width=2, topk=5, scorer=Rising())
    check_tree(tree, cand, 7)
    assert tree.num_draft == 7


def test_dart_defaults_shape():
    rng = np.random.default_rng(0)
    cand = random_depth_table(rng, 8, 25, vocab=1000, rho=random_ngram(rng, vocab=1000))
    tree = build_tree("beam", cand, 59, scorer="dart")
    assert tree.num_draft == 59 and tree.max_depth <= 8
    check_tree(tree, cand, 59, 8)


# ----------------------------------------------------------------------------- threshold, static
@settings(max_examples=60, deadline=None)
@given(seed=seeds, kind=st.sampled_from(["table", "exp"]), branch=st.integers(1, 4),
       depth=st.integers(1, 5), tau=st.floats(1e-4, 0.9), budget=st.integers(0, 60),
       ties=st.booleans())
def test_threshold_never_keeps_a_path_below_tau(seed, kind, branch, depth, tau, budget, ties):
    cand = make_candidates(seed, kind, 5, 4, ties, pad=True)
    tree = build_tree("threshold", cand, budget, branch=branch, max_depth=depth, tau=tau)
    check_tree(tree, cand, budget, depth)
    for i in range(1, tree.num_nodes):
        path = tree.path_tokens(i)
        cum = sum(dict(children(cand, path[:d], d, 1024))[path[d]] for d in range(len(path)))
        assert cum >= math.log(tau)
    assert token_paths(tree) == reference_threshold(cand, budget, branch, depth, tau)


@settings(max_examples=40, deadline=None)
@given(seed=seeds, template=st.lists(st.integers(1, 4), min_size=1, max_size=4),
       budget=st.integers(0, 300))
def test_static_follows_the_template(seed, template, budget):
    cand = make_candidates(seed, "table", 4, 4, ties=False, pad=False)
    tree = build_tree("static", cand, budget, template=tuple(template))
    full = 0
    width = 1
    for f in template:
        width *= f
        full += width
    assert tree.num_draft == min(budget, full)
    kids = tree.children()
    if budget >= full:
        for i in range(tree.num_nodes):
            d = int(tree.depth[i])
            assert len(kids[i]) == (template[d] if d < len(template) else 0)
    assert list(tree.depth) == sorted(tree.depth)  # breadth-first


def test_chain():
    cand = random_depth_table(np.random.default_rng(1), 5, 3, pad=False)
    tree = build_tree("chain", cand, 3)
    assert tree.draft_token_ids() == cand.tokens[:3, 0].tolist()
    assert tree.parents.tolist() == [-1, 0, 1, 2]
    exp = hashed_expander(3, root=2)
    t2 = build_tree("chain", exp, 6, max_depth=4)
    assert t2.num_draft == 4
    assert t2.draft_token_ids() == [p[-1] for p in brute_force_best_first(exp, 100, 4, 1)]


# ----------------------------------------------------------------------------- errors
@pytest.fixture
def table():
    return random_depth_table(np.random.default_rng(0), 3, 4)


@pytest.mark.parametrize("args, kwargs, match", [
    (("nope",), {}, r"unknown tree builder 'nope'; known: beam, best_first, chain, static"),
    (("beam",), {"beam_width": 3}, r"unknown parameter\(s\) \['beam_width'\]; allowed: backend"),
    (("beam",), {"width": 0}, r"builder 'beam': parameter 'width' must be an int in \[1, 65536\]"),
    (("beam",), {"topk": 9}, r"parameter 'topk' must be an int in \[1, 4\], got 9"),
    (("beam",), {"max_depth": 4}, r"parameter 'max_depth' must be an int in \[0, 3\]"),
    (("beam",), {"backend": "gpu"}, r"parameter 'backend' must be one of"),
    (("beam",), {"scorer": "bogus"}, r"unknown scorer 'bogus'"),
    (("beam",), {"scorer": "dart"}, r"scorer 'dart' needs an n-gram signal: pass rho="),
    (("beam",), {"scorer": "presto", "scorer_params": {"lam": -1}},
     r"scorer 'presto': parameter 'lam' must be a number in \[0.0, 100.0\]"),
    (("beam",), {"scorer_params": {"x": 1}}, r"scorer 'acc_logp': unknown parameter"),
    (("threshold",), {"tau": 0.0}, r"parameter 'tau' must be a number in \(0.0, 1.0\]"),
    (("threshold",), {"branch": 5}, r"parameter 'branch' must be an int in \[1, 4\]"),
    (("static",), {"template": (2, 2, 2, 2)}, r"'template' has 4 levels but the candidates"),
    (("static",), {"template": (5,)}, r"parameter 'template' must be an int in \[1, 4\]"),
    (("static",), {"template": "321"}, r"'template' must be a non-empty sequence"),
    (("best_first",), {"greedy_spine": 1}, r"parameter 'greedy_spine' must be true or false"),
    (("best_first",), {"topk": [2, 2]}, r"'topk' needs one entry per level \(3\)"),
])
def test_clear_errors(table, args, kwargs, match):
    with pytest.raises(BuildError, match=match):
        build_tree(args[0], table, 5, **kwargs)


def test_budget_and_candidate_errors(table):
    with pytest.raises(BuildError, match=r"parameter 'budget' must be an int in \[0, 65536\]"):
        build_tree("beam", table, -1)
    with pytest.raises(BuildError, match="candidates must be a DepthTable or an Expander"):
        build_tree("beam", [[1, 2]], 3)
    exp = hashed_expander(0, root=1)
    with pytest.raises(BuildError, match="backend='cpp' is not available: the candidates are an"):
        build_tree("beam", exp, 3, backend="cpp")
    custom = random_depth_table(np.random.default_rng(0), 3, 4, rho=lambda ctx, t: -1.0)
    with pytest.raises(BuildError, match="rho has no C\\+\\+ twin"):
        build_tree("beam", custom, 3, scorer="presto", backend="cpp")
    assert build_tree("beam", custom, 3, scorer="presto").num_draft == 3  # auto -> Python
    assert set(builder_params("beam")) >= {"width", "topk", "scorer", "early_stop"}


@pytest.mark.parametrize("tokens, logprobs, match", [
    ([[1, 1]], [[-1, -2]], "row 0 repeats a token"),
    ([[-1, 1]], [[-1, -2]], "padding before a real token"),
    ([[1, 2]], [[-2, -1]], "non-increasing"),
    ([[1, 2]], [[0.5, -1]], "finite and <= 0"),
    ([[1, 2]], [[-1]], "logprobs shape"),
    ([1, 2], [-1, -2], "must be 2-D"),
])
def test_depth_table_errors(tokens, logprobs, match):
    from vllm_treespec.tree import CandidateError

    with pytest.raises(CandidateError, match=match):
        DepthTable(tokens, logprobs, root=0)


def test_scorer_formulas():
    lq, g = np.array([-0.5, -2.0]), np.array([-1.0, -30.0])
    assert make_scorer("acc_logp").increments(3, lq, None).tolist() == lq.tolist()
    got = make_scorer("dart").increments(2, lq, g)
    eps = 1e-10
    want = [(0.9 ** 2 * math.log(math.exp(a) + eps) + 0.5 * math.log(math.exp(b) + eps))
            * 3 ** -0.7 for a, b in zip(lq, g)]
    assert got.tolist() == pytest.approx(want, rel=1e-15)
    assert make_scorer("presto").increments(0, lq, g).tolist() == (lq + 0.2 * g).tolist()
    ent = make_scorer("presto_entropy", {"beta": 0.4, "C": 1.0})
    assert ent.coeffs(0, 1.0)[1] == pytest.approx(0.2)
    assert ent.coeffs(0, 0.0)[1] == 0.0 and ent.coeffs(0, 1e9)[1] == pytest.approx(0.4)
