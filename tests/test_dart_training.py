"""DART recipe (train/dart_recipe.py) and feature shards (train/shards.py): the annealed KL is
zero exactly at the teacher and weights depths by gamma^(t-1); training learns a synthetic
language the teacher knows; a stopped run resumes bit-exactly; shards round-trip."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from vllm_treespec.drafters.heads.dart import DartConfig, DartHead
from vllm_treespec.train.dart_recipe import DartRecipe, dart_loss, evaluate_head, train_dart
from vllm_treespec.train.shards import FeatureShard, SequenceWindows, Window, load_shards, save_shard

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V, H, F = 23, 32, 96


def _synthetic_shard(num_seqs=40, length=40, seed=0, k=4) -> FeatureShard:
    """Sequences of a deterministic language x_{i+1} = succ[x_i]; the teacher at row i puts almost
    all mass on x_{i+1}. Features are noise, so the head must use the shifted token embedding."""
    g = torch.Generator().manual_seed(seed)
    succ = torch.randperm(V, generator=g)
    toks = []
    for _ in range(num_seqs):
        x = [int(torch.randint(0, V, (1,), generator=g))]
        for _ in range(length - 1):
            x.append(int(succ[x[-1]]))
        toks.append(torch.tensor(x))
    tokens = torch.cat(toks)
    nxt = torch.cat([torch.cat([t[1:], t[-1:]]) for t in toks])
    others = torch.stack([(nxt + 1 + j) % V for j in range(k - 1)], 1)
    ids = torch.cat([nxt[:, None], others], 1)
    lps = torch.log_softmax(torch.tensor([4.0] + [0.0] * (k - 1)), 0).expand(len(tokens), k).clone()
    feats = torch.randn(len(tokens), F, generator=g).half()
    offsets = torch.arange(0, num_seqs * length + 1, length)
    return FeatureShard(feats, tokens, ids, lps, offsets)


def _head(depth=3, seed=0):
    """A head over the same frozen 'target' embedding whatever the seed of its own weights."""
    torch.manual_seed(1234)
    embed = nn.Embedding(V, H)
    torch.manual_seed(seed)
    cfg = DartConfig(hidden_size=H, vocab_size=V, target_num_layers=4, feature_layers=(0, 1, 2),
                     depth=depth, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64)
    return DartHead(cfg, embed)


def test_loss_is_zero_at_the_teacher_and_weighted_by_gamma():
    b, w, d = 1, 4, 2
    teacher = torch.log_softmax(torch.randn(b, w, V), -1)
    ids = torch.arange(V).expand(b, w, V).clone()
    window = Window(torch.zeros(b, w, F), torch.zeros(b, w, dtype=torch.int64), ids, teacher.clone(),
                    torch.tensor([w]))
    p = w - 1
    perfect = torch.stack([teacher[:, torch.clamp(torch.arange(p) + t, max=w - 1)] for t in (1, 2)], 2)
    assert float(dart_loss(perfect, window, 0.6)) == pytest.approx(0.0, abs=1e-6)
    # uniform logits: per-pair KL = log V - H(teacher); weights 1 and 0.6, pairs with g + t <= w - 1
    kl = lambda row: float((teacher[0, row].exp() * (teacher[0, row] + torch.log(torch.tensor(float(V))))).sum())
    pairs = [(g, t) for g in range(p) for t in (1, 2) if g + t <= w - 1]
    want = sum(0.6 ** (t - 1) * kl(g + t) for g, t in pairs) / sum(0.6 ** (t - 1) for _, t in pairs)
    assert float(dart_loss(torch.zeros(b, p, d, V), window, 0.6)) == pytest.approx(want, rel=1e-5)


def test_training_learns_the_teachers_language(tmp_path):
    train, held = SequenceWindows(_synthetic_shard(), 16), SequenceWindows(_synthetic_shard(seed=0, num_seqs=8), 16)
    head = _head()
    before = evaluate_head(head, held)
    recipe = DartRecipe(steps=150, batch_size=8, window=16, lr=3e-3, warmup=10, checkpoint_every=50)
    losses = train_dart(head, train, recipe, tmp_path, progress=False)
    after = evaluate_head(head, held)
    assert losses[-1] < 0.5 * losses[0]
    assert after["accuracy"][0] > 0.9 > before["accuracy"][0] + 0.3
    assert after["accuracy"][1] > 0.6 and min(after["hit_at_10"]) > 0.8


def check_resume_is_exact(train, make_head, windows, recipe, changed_recipe, tmp_path) -> None:
    """A run stopped at step 5 and resumed in a 'fresh process' (other initial weights) ends with
    the same weights as an uninterrupted run; resuming with another recipe is refused."""
    straight = make_head()
    train(straight, windows, recipe, tmp_path / "a", progress=False)
    train(make_head(), windows, recipe, tmp_path / "b", progress=False, stop_after=5)   # stops mid-way
    other = make_head(seed=9)                          # a fresh process: weights come from the state
    losses = train(other, windows, recipe, tmp_path / "b", progress=False)
    assert len(losses) == recipe.steps - 5
    for (k, a), (_, b) in zip(straight.trainable_state().items(), other.trainable_state().items()):
        assert torch.equal(a, b), k
    with pytest.raises(ValueError, match="resume with"):
        train(make_head(), windows, changed_recipe, tmp_path / "b", progress=False)


def test_a_stopped_run_resumes_exactly(tmp_path):
    recipe = DartRecipe(steps=12, batch_size=4, window=12, warmup=3, checkpoint_every=6)
    check_resume_is_exact(train_dart, _head, SequenceWindows(_synthetic_shard(num_seqs=12), 12), recipe,
                          replace(recipe, lr=1.0), tmp_path)


def test_shards_round_trip_and_reject_inconsistent_data(tmp_path):
    a, b = _synthetic_shard(num_seqs=3, length=5), _synthetic_shard(num_seqs=2, length=7, seed=1)
    both = load_shards([save_shard(a, tmp_path / "a.safetensors"), save_shard(b, tmp_path / "b.safetensors")])
    assert both.num_sequences == 5 and both.seq_offsets.tolist() == [0, 5, 10, 15, 22, 29]
    assert torch.equal(both.tokens[15:], b.tokens)
    with pytest.raises(ValueError, match="inconsistent feature shard"):
        FeatureShard(a.features[:-1], a.tokens, a.topk_ids, a.topk_logprobs, a.seq_offsets)
    windows = SequenceWindows(both, 4)
    assert all(2 <= e - s <= 4 for s, e in windows.spans)
    picked = both.subset(torch.tensor([False, True, False, True, False]))
    assert picked.seq_offsets.tolist() == [0, 5, 12] and torch.equal(picked.tokens[5:], b.tokens[:7])
    assert torch.equal(picked.tokens[:5], a.tokens[5:10])
