"""Statistical losslessness of the stochastic acceptance rules.

Each test runs tens of thousands of independent verification steps in one batched call and
compares the emitted tokens with their exact law under the target (chi-square, fixed seeds, so
every p-value is deterministic). Negative checks run deliberately wrong rules through the same
test and must fail it, which shows the test has the power to catch a biased rule.

- target_only: a fixed candidate tree (the rule must be lossless for ANY tree fixed before the
  coins): the whole emitted sequence of one step must follow the product of the processed target
  rows along it.
- rrs: the tree is random (drafted from q), so only the marginal law is the target's. Each trial
  is a generation stream: draft a tree from q at the current prefix, verify, append the emitted
  tokens, repeat until L tokens exist; the first L stream tokens must follow prod p(x_i | x_<i).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from support.verify_cases import (
    chi_square_pvalue,
    emitted_distribution,
    encode_rows,
    encode_sequence,
)
from vllm_treespec.tree import TreeBatch
from vllm_treespec.verify import SamplingParamsBatch, accept, target_probs

pytestmark = pytest.mark.usefixtures("one_torch_thread")


P_PASS = 1e-4  # positive checks must exceed this
P_FAIL = 1e-8  # negative checks must fall below this

# (temperature, top_k, top_p, min_p): plain, each filter alone, all together
PARAM_SETS = [
    (1.0, 0, 1.0, 0.0),
    (0.7, 3, 1.0, 0.0),
    (1.3, -1, 0.8, 0.0),
    (0.9, 0, 1.0, 0.12),
    (1.1, 4, 0.9, 0.05),
]


def _params(sets, repeat: int) -> SamplingParamsBatch:
    cols = list(zip(*[s for s in sets for _ in range(repeat)]))
    return SamplingParamsBatch.from_lists(*cols)


def _counts(codes: np.ndarray) -> dict[int, int]:
    keys, counts = np.unique(codes, return_counts=True)
    return dict(zip(keys.tolist(), counts.tolist()))


def _random_logits(rng: np.random.Generator, rows: int, vocab: int) -> torch.Tensor:
    """Random target logits with some near-zero-probability tokens (logit -14)."""
    logits = rng.normal(0.0, 1.5, size=(rows, vocab))
    logits[rng.random((rows, vocab)) < 0.2] = -14.0
    return torch.tensor(logits, dtype=torch.float32)


# ----------------------------------------------------------------------------- target_only

# A fixed top-k-like tree over V=7: root -> 3 children; they have 2, 1, 0 children; one depth 3.
FIXED_TOKENS = [0, 2, 5, 1, 4, 0, 6, 3]
FIXED_PARENTS = [-1, 0, 0, 0, 1, 1, 2, 4]
V_FIXED = 7


def _tile_tree(tokens, parents, copies: int) -> TreeBatch:
    n = len(tokens)
    return TreeBatch.from_arrays(torch.arange(copies + 1, dtype=torch.int64) * n,
                                 torch.tensor(tokens, dtype=torch.int64).repeat(copies),
                                 torch.tensor(parents, dtype=torch.int64).repeat(copies))


def _run_fixed_tree(mode: str, copies: int, seed: int, draft=None, replacement=None):
    rng = np.random.default_rng(seed)
    n = len(FIXED_TOKENS)
    base_logits = _random_logits(rng, n, V_FIXED)
    # Make most tree tokens likely so deep paths get exercised (one child stays near zero).
    for i, par in enumerate(FIXED_PARENTS):
        if par >= 0 and i != 3:
            base_logits[par, FIXED_TOKENS[i]] = float(rng.normal(1.0, 0.7))
    sets = PARAM_SETS
    batch = copies * len(sets)
    tree = _tile_tree(FIXED_TOKENS, FIXED_PARENTS, batch)
    res = accept(
        tree,
        base_logits.repeat(batch, 1),
        mode=mode,
        sampling=_params(sets, copies),
        generators=torch.Generator().manual_seed(seed),
        draft_probs=None if draft is None else draft.repeat(batch, 1),
        replacement=replacement,
    )
    width = res.emitted.shape[1]
    out = []
    for s, ps in enumerate(sets):
        probs = target_probs(base_logits, _params([ps], n)).double().numpy()
        law = emitted_distribution(FIXED_TOKENS, FIXED_PARENTS, probs)
        expected = {encode_sequence(k, width, V_FIXED): v for k, v in law.items()}
        assert sum(v > 1e-3 for v in law.values()) >= 8  # a non-degenerate law
        rows = res.emitted[s * copies : (s + 1) * copies].numpy()
        first = {}
        for k, v in law.items():
            first[k[0]] = first.get(k[0], 0.0) + v
        out.append(
            (
                chi_square_pvalue(_counts(encode_rows(rows, V_FIXED)), expected)[2],
                chi_square_pvalue(_counts(rows[:, 0]), first)[2],
            )
        )
    return out


def test_target_only_emitted_sequence_follows_target():
    results = _run_fixed_tree("target_only", copies=24_000, seed=11)
    print("target_only p-values (sequence, first token):", results)
    for seq_p, first_p in results:
        assert seq_p > P_PASS and first_p > P_PASS


def test_rrs_on_fixed_topk_tree_fails_the_same_test():
    """Negative: rrs (accept if u * q(x) < p(x)) on deterministic top-k children is biased."""
    rng = np.random.default_rng(5)
    draft = torch.softmax(torch.tensor(rng.normal(0, 1.5, (len(FIXED_TOKENS), V_FIXED))), -1)
    results = _run_fixed_tree("rrs", copies=24_000, seed=11, draft=draft.float(), replacement=False)
    print("rrs-on-top-k p-values (sequence, first token):", results)
    assert all(seq_p < P_FAIL for seq_p, _ in results)


def test_naive_sibling_rule_fails_the_same_test():
    """Negative: try siblings with p(c_i) against fresh coins WITHOUT renormalising by the mass
    already tried, then correct from p over the non-children (a common hand-rolled bug)."""
    rng = np.random.default_rng(3)
    logits = _random_logits(rng, 1, V_FIXED)[0]
    p = torch.softmax(logits.double(), -1).numpy()
    kids = [2, 5, 1]
    n = 40_000
    coins = rng.random((n, len(kids) + 1))
    out = np.full(n, -1)
    for j, c in enumerate(kids):
        hit = (out < 0) & (coins[:, j] < p[c])
        out[hit] = c
    rest = p.copy()
    rest[kids] = 0
    rest /= rest.sum()
    left = out < 0
    out[left] = np.searchsorted(np.cumsum(rest), coins[left, -1], side="right")
    pval = chi_square_pvalue(_counts(out), dict(enumerate(p.tolist())))[2]
    print("naive sibling rule p-value:", pval)
    assert pval < P_FAIL


def test_greedy_accept_then_sample_fails_the_same_test():
    """Negative: accept a child when it is the target's argmax, otherwise sample from p."""
    rng = np.random.default_rng(4)
    p = torch.softmax(torch.tensor(rng.normal(0, 1.0, V_FIXED)), -1).numpy()
    kids = np.argsort(-p)[[0, 2]]  # top-1 and top-3 tokens are drafted
    n = 40_000
    sampled = np.searchsorted(np.cumsum(p), rng.random(n), side="right")
    out = np.full(n, int(np.argmax(p))) if int(np.argmax(p)) in kids else sampled
    pval = chi_square_pvalue(_counts(out), dict(enumerate(p.tolist())))[2]
    print("greedy-accept-then-sample p-value:", pval)
    assert pval < P_FAIL


# ----------------------------------------------------------------------------- rrs streams


class PrefixModel:
    """Target logits and draft probabilities as functions of the whole prefix (length <= max_len),
    stored as tables indexed by (length, base-V value of the prefix)."""

    def __init__(self, rng: np.random.Generator, vocab: int, max_len: int, draft_temp: float):
        self.vocab = vocab
        self.base = np.cumsum([0] + [vocab**k for k in range(max_len + 1)])
        rows = int(self.base[-1])
        self.logits = _random_logits(rng, rows, vocab)
        noise = rng.normal(0, 1.0, (rows, vocab))
        noise[rng.random((rows, vocab)) < 0.15] = -12.0  # near-zero draft probabilities
        # Drafts correlated with the target but different, peaky enough to repeat tokens.
        noise = torch.tensor(noise, dtype=torch.float32)
        self.q = torch.softmax((self.logits.clamp(min=-4) + noise) / draft_temp, -1)

    def index(self, length: np.ndarray, value: np.ndarray) -> np.ndarray:
        return self.base[length] + value


def _merge_draws(draws: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[M, k] draws in order -> (is first occurrence, num_draws = gap to the next first one)."""
    m, k = draws.shape
    first = np.ones((m, k), dtype=bool)
    for j in range(1, k):
        first[:, j] = (draws[:, :j] != draws[:, j : j + 1]).all(axis=1)
    gaps = np.zeros((m, k), dtype=np.int64)
    nxt = np.full(m, k)
    for j in range(k - 1, -1, -1):
        gaps[:, j] = np.where(first[:, j], nxt - j, 0)
        nxt = np.where(first[:, j], j, nxt)
    return first, gaps


def _draw_children(rng, q: np.ndarray, k: int, replacement: bool) -> tuple[np.ndarray, ...]:
    """k draws per row of q [M, V] in draw order: i.i.d. or without replacement (Gumbel top-k)."""
    if replacement:
        cdf = np.cumsum(q, axis=1)
        u = rng.random((q.shape[0], k)) * cdf[:, -1:]
        draws = np.minimum((cdf[:, None, :] <= u[:, :, None]).sum(-1), q.shape[1] - 1)
        first, gaps = _merge_draws(draws)
    else:
        keys = np.log(q) - np.log(-np.log(rng.random(q.shape)))
        draws = np.argsort(-keys, axis=1)[:, :k]
        first, gaps = np.ones(draws.shape, dtype=bool), np.ones(draws.shape, dtype=np.int64)
    return draws, first, gaps


def _draft_trees(rng, model: PrefixModel, length, value, fanout, replacement, topk=False):
    """Two-level draft trees (fanout[0] draws at the root, fanout[1] at each child) for prefixes
    (length, value); returns the flat batch, node prefix rows, num_draws and the draws each
    node made (node_draws: fanout[0] at the root, fanout[1] at depth 1, 0 at the leaves)."""
    n = length.shape[0]
    k1, k2 = fanout
    vocab = model.vocab
    root_idx = model.index(length, value)
    q_np = model.q.double().numpy()
    if topk:
        d1 = np.argsort(-q_np[root_idx], axis=1)[:, :k1]
        f1, g1 = np.ones(d1.shape, dtype=bool), np.ones(d1.shape, dtype=np.int64)
    else:
        d1, f1, g1 = _draw_children(rng, q_np[root_idx], k1, replacement)
    v1 = value[:, None] * vocab + d1
    idx1 = model.index(length[:, None] + 1, v1)
    if topk:
        d2 = np.argsort(-q_np[idx1.reshape(-1)], axis=1)[:, :k2]
        f2, g2 = np.ones(d2.shape, dtype=bool), np.ones(d2.shape, dtype=np.int64)
    else:
        d2, f2, g2 = _draw_children(rng, q_np[idx1.reshape(-1)], k2, replacement)
    d2, f2, g2 = (a.reshape(n, k1, k2) for a in (d2, f2, g2))
    idx2 = model.index(length[:, None, None] + 2, v1[:, :, None] * vocab + d2)

    valid = np.concatenate(
        [np.ones((n, 1), bool), f1, (f1[:, :, None] & f2).reshape(n, -1)], axis=1
    )
    compact = np.cumsum(valid, axis=1) - 1
    tokens = np.concatenate([np.zeros((n, 1), np.int64), d1, d2.reshape(n, -1)], axis=1)
    parents = np.concatenate(
        [
            np.full((n, 1), -1),
            np.zeros((n, k1), np.int64),
            np.repeat(compact[:, 1 : 1 + k1], k2, axis=1),
        ],
        axis=1,
    )
    rows = np.concatenate([root_idx[:, None], idx1, idx2.reshape(n, -1)], axis=1)
    draws = np.concatenate([np.ones((n, 1), np.int64), g1, g2.reshape(n, -1)], axis=1)
    made = np.concatenate([np.full((n, 1), k1), np.full((n, k1), k2), np.zeros((n, k1 * k2), np.int64)],
                          axis=1)
    counts = valid.sum(axis=1)
    tree = TreeBatch.from_arrays(np.concatenate([[0], np.cumsum(counts)]), tokens[valid],
                                 parents[valid])
    return tree, rows[valid], torch.tensor(draws[valid]), torch.tensor(made[valid])


def _cut_prefix(tree, rows, draws, made, keep: int):
    """Each tree cut to its first `keep` nodes (breadth-first: a prefix of every node's
    children), num_draws and node_draws left as they were before the cut."""
    offsets = tree.offsets
    sizes = (offsets[1:] - offsets[:-1]).clamp(max=keep)
    local = torch.arange(int(offsets[-1])) - torch.repeat_interleave(offsets[:-1], offsets[1:] - offsets[:-1])
    kept = local < keep
    cut = TreeBatch.from_arrays(torch.cat([torch.zeros(1, dtype=torch.int64), sizes.cumsum(0)]),
                                tree.tokens[kept], tree.parents[kept])
    return cut, rows[kept.numpy()], draws[kept], made[kept]


def _claimed(tree, num_draws: torch.Tensor | None) -> torch.Tensor:
    """node_draws as a caller would report it from the tree it passes: the sum of each node's
    children's num_draws (what the cut or merge left), whatever the node really drew."""
    offsets, parents = tree.offsets, tree.parents
    base = torch.repeat_interleave(offsets[:-1], offsets[1:] - offsets[:-1])
    per = torch.ones_like(parents) if num_draws is None else num_draws
    out = torch.zeros_like(parents)
    draft = parents >= 0
    out.index_add_(0, (parents + base)[draft], per[draft])
    return out


def _run_streams(
    model: PrefixModel,
    sets,
    trials: int,
    stream_len: int,
    fanout,
    replacement: bool,
    seed: int,
    topk: bool = False,
    use_num_draws: bool = True,
    drop_q: float = 0.0,
    cut: int | None = None,
    node_draws: str = "made",
):
    """Generation streams (module docstring). cut: verify each tree cut to its first `cut`
    nodes; node_draws (replacement only): "made" = the draws each node made (honest), "claimed"
    = what the passed num_draws add up to (a caller hiding a cut or an ignored merge)."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    n = trials * len(sets)
    params = _params(sets, trials)
    stream = np.full((n, stream_len), -1, dtype=np.int64)
    length = np.zeros(n, dtype=np.int64)
    value = np.zeros(n, dtype=np.int64)
    while (length < stream_len).any():
        live = np.nonzero(length < stream_len)[0]
        tree, rows, draws, made = _draft_trees(
            rng, model, length[live], value[live], fanout, replacement, topk
        )
        if cut is not None:
            tree, rows, draws, made = _cut_prefix(tree, rows, draws, made, cut)
        passed = draws if (replacement and use_num_draws) else None
        q_rows, q_index = model.q[torch.tensor(rows)], None
        if drop_q:   # compact form: a random share of nodes has no q row (target-only there)
            has = rng.random(len(rows)) >= drop_q
            q_rows = q_rows[torch.from_numpy(has)]
            q_index = torch.from_numpy(np.where(has, np.cumsum(has) - 1, -1))
        res = accept(
            tree,
            model.logits[torch.tensor(rows)],
            mode="rrs",
            sampling=params.rows(torch.tensor(live)),
            generators=gen,
            draft_probs=q_rows,
            draft_rows=q_index,
            replacement=replacement,
            num_draws=passed,
            node_draws=(made if node_draws == "made" else _claimed(tree, passed)) if replacement else None,
        )
        emitted, num = res.emitted.numpy(), res.num_emitted.numpy()
        for j in range(emitted.shape[1]):
            take = (j < num) & (length[live] < stream_len)
            who = live[take]
            stream[who, length[who]] = emitted[take, j]
            value[who] = value[who] * model.vocab + emitted[take, j]
            length[who] += 1
    out = []
    vocab = model.vocab
    seqs = np.array(np.meshgrid(*[np.arange(vocab)] * stream_len, indexing="ij")).reshape(
        stream_len, -1
    ).T
    for s, ps in enumerate(sets):
        probs = target_probs(model.logits, _params([ps], model.logits.shape[0])).double().numpy()
        law = np.ones(len(seqs))
        val = np.zeros(len(seqs), dtype=np.int64)
        for i in range(stream_len):
            law *= probs[model.index(np.full(len(seqs), i), val), seqs[:, i]]
            val = val * vocab + seqs[:, i]
        codes = encode_rows(seqs, vocab)
        block = stream[s * trials : (s + 1) * trials]
        joint = chi_square_pvalue(
            _counts(encode_rows(block, vocab)), dict(zip(codes.tolist(), law))
        )
        first_law = probs[0]
        first = chi_square_pvalue(_counts(block[:, 0]), dict(enumerate(first_law.tolist())))
        out.append((joint[2], first[2]))
    return out


RRS_SETS = [PARAM_SETS[0], PARAM_SETS[4], PARAM_SETS[3]]


@pytest.mark.parametrize("vocab,fanout", [(6, (3, 2)), (8, (2, 3))])
@pytest.mark.parametrize("replacement", [False, True], ids=["without_repl", "with_repl"])
def test_rrs_stream_follows_target(replacement, vocab, fanout):
    model = PrefixModel(np.random.default_rng(vocab), vocab=vocab, max_len=4, draft_temp=0.8)
    results = _run_streams(
        model, RRS_SETS, trials=25_000, stream_len=3, fanout=fanout, replacement=replacement,
        seed=22,
    )
    print(f"rrs replacement={replacement} V={vocab} fanout={fanout} p-values "
          "(3-token joint, first token):", results)
    for joint_p, first_p in results:
        assert joint_p > P_PASS and first_p > P_PASS


def test_rrs_compact_rows_mix_rrs_and_target_only_nodes():
    """Compact draft_rows: nodes without a q row use the target-only rule, node by node, in the
    same walk as rrs nodes; the emitted stream still follows the target."""
    model = PrefixModel(np.random.default_rng(31), vocab=6, max_len=4, draft_temp=0.8)
    results = _run_streams(model, RRS_SETS[:2], trials=25_000, stream_len=3, fanout=(3, 2),
                           replacement=False, seed=23, drop_q=0.4)
    print("rrs compact (40% target-only nodes) p-values:", results)
    for joint_p, first_p in results:
        assert joint_p > P_PASS and first_p > P_PASS


def test_rrs_topk_children_fail_stream_test():
    """Negative: the same stream test with deterministic top-k children instead of draws."""
    model = PrefixModel(np.random.default_rng(21), vocab=6, max_len=4, draft_temp=0.8)
    results = _run_streams(
        model, RRS_SETS[:1], trials=22_000, stream_len=3, fanout=(3, 2), replacement=False,
        seed=22, topk=True,
    )
    print("rrs on top-k children p-values:", results)
    assert results[0][0] < P_FAIL


def test_rrs_merged_draws_without_num_draws_fail():
    """Negative: i.i.d. draws merged into distinct siblings but verified as if each sibling were
    one draw (num_draws ignored). Repeats must still apply their residual update."""
    model = PrefixModel(np.random.default_rng(8), vocab=6, max_len=4, draft_temp=0.35)
    kwargs = dict(trials=40_000, stream_len=2, fanout=(4, 1), replacement=True, seed=9)
    bad = _run_streams(model, RRS_SETS[:1], use_num_draws=False, node_draws="claimed", **kwargs)
    good = _run_streams(model, RRS_SETS[:1], use_num_draws=True, **kwargs)
    print("merged draws p-values, without / with num_draws:", bad, good)
    assert bad[0][1] < P_FAIL
    assert good[0][0] > P_PASS and good[0][1] > P_PASS


def test_rrs_with_replacement_rejects_a_prefix_cut():
    """A tree of merged i.i.d. draws cut to a node prefix (the kept sibling keeping its pre-cut
    num_draws) is refused: its root made 4 draws, its kept child stands for fewer."""
    model = PrefixModel(np.random.default_rng(8), vocab=6, max_len=4, draft_temp=0.35)
    with pytest.raises(ValueError, match="cut to a node prefix"):
        _run_streams(model, RRS_SETS[:1], trials=2_000, stream_len=2, fanout=(4, 1),
                     replacement=True, seed=9, cut=2)


def test_rrs_with_replacement_prefix_cut_is_biased():
    """Why the cut is refused: the same cut trees verified anyway (node_draws claimed from the
    cut tree, so the check passes) fail the stream test; the uncut trees pass it
    (test_rrs_merged_draws_without_num_draws_fail, same model and seed). The kept draws are
    those before the first draw of a new token: a set chosen by the draws' own values."""
    model = PrefixModel(np.random.default_rng(8), vocab=6, max_len=4, draft_temp=0.35)
    cut = _run_streams(model, RRS_SETS[:1], trials=20_000, stream_len=2, fanout=(4, 1),
                       replacement=True, seed=9, cut=2, node_draws="claimed")
    print("prefix-cut merged draws p-values:", cut)
    assert cut[0][1] < P_FAIL


@pytest.mark.parametrize("cut", [2, 5])
def test_rrs_without_replacement_prefix_cut_follows_target(cut):
    """Draws without replacement cut to a node prefix (what the engine's scheduler does to a
    sampled tree) stay lossless: each node keeps its first k draws, k fixed by the other nodes."""
    model = PrefixModel(np.random.default_rng(6), vocab=6, max_len=4, draft_temp=0.8)
    results = _run_streams(model, RRS_SETS[:2], trials=20_000, stream_len=3, fanout=(3, 2),
                           replacement=False, seed=24, cut=cut)
    print(f"rrs without replacement cut to {cut} nodes p-values:", results)
    for joint_p, first_p in results:
        assert joint_p > P_PASS and first_p > P_PASS
