"""JetSpec recipe (train/jetspec_recipe.py): random anchors are distinct, in range and a function
of (seed, step); the forward KL at temperature T is zero at the teacher and averages depths
uniformly; causal and bidirectional heads learn a language the teacher knows; a stopped run
resumes bit-exactly."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from test_dart_training import F, V, _synthetic_shard, check_resume_is_exact
from vllm_treespec.drafters.heads.jetspec import JetSpecConfig, JetSpecHead
from vllm_treespec.train.jetspec_recipe import JetSpecRecipe, jetspec_loss, sample_anchors, train_jetspec
from vllm_treespec.train.loop import distill_kl, evaluate_head
from vllm_treespec.train.shards import SequenceWindows, Window

pytestmark = pytest.mark.usefixtures("one_torch_thread")

H = 32


def _head(within="causal", depth=3, seed=0):
    torch.manual_seed(1234)
    embed = nn.Embedding(V, H)
    torch.manual_seed(seed)
    cfg = JetSpecConfig(hidden_size=H, vocab_size=V, target_num_layers=4, feature_layers=(0, 1, 2),
                        depth=depth, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                        intermediate_size=64, within_block=within)
    return JetSpecHead(cfg, embed)


def test_anchors_are_distinct_in_range_and_reproducible():
    valid = torch.tensor([10, 3, 1, 40])
    a1, act1 = sample_anchors(valid, 6, torch.Generator().manual_seed(5))
    a2, act2 = sample_anchors(valid, 6, torch.Generator().manual_seed(5))
    assert torch.equal(a1, a2) and torch.equal(act1, act2) and a1.shape == (4, 6)
    assert act1.sum(1).tolist() == [6, 2, 0, 6]
    for i, n in enumerate(valid.tolist()):
        picked = a1[i][act1[i]].tolist()
        assert len(set(picked)) == len(picked) and all(0 <= g <= n - 2 for g in picked)


def test_kl_is_zero_at_the_teacher_and_uniform_over_depths():
    b, w, d, T = 1, 5, 2, 2.0
    teacher = torch.log_softmax(torch.randn(b, w, V), -1)
    ids = torch.arange(V).expand(b, w, V).clone()
    window = Window(torch.zeros(b, w, F), torch.zeros(b, w, dtype=torch.int64), ids, teacher.clone(),
                    torch.tensor([w]))
    prefixes, active = torch.tensor([[0, 2, 3]]), torch.tensor([[True, True, False]])
    perfect = torch.stack([teacher[:, (prefixes[0] + t).clamp(max=w - 1)] for t in (1, 2)], 2)
    ones = torch.ones(d)
    assert float(distill_kl(perfect, window, prefixes, ones, T, active)) == pytest.approx(0.0, abs=1e-6)
    # uniform head logits: per-pair KL = log V - H(p_T), p_T = softmax(teacher / T)
    def kl(row):
        p = torch.log_softmax(teacher[0, row] / T, -1)
        return float((p.exp() * (p + math.log(V))).sum())
    pairs = [(g, t) for g in (0, 2) for t in (1, 2) if g + t <= w - 1]
    want = sum(kl(g + t) for g, t in pairs) / len(pairs)
    got = distill_kl(torch.zeros(b, 3, d, V), window, prefixes, ones, T, active)
    assert float(got) == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("within", ["causal", "bidirectional"])
def test_training_learns_the_teachers_language(tmp_path, within):
    train, held = SequenceWindows(_synthetic_shard(), 16), SequenceWindows(_synthetic_shard(num_seqs=8), 16)
    head = _head(within)
    before = evaluate_head(head, held)
    recipe = JetSpecRecipe(steps=150, batch_size=8, window=16, anchors=8, lr=3e-3, warmup=10,
                           checkpoint_every=50)
    losses = train_jetspec(head, train, recipe, tmp_path, progress=False)
    after = evaluate_head(head, held)
    assert losses[-1] < 0.5 * losses[0]
    assert after["accuracy"][0] > 0.9 > before["accuracy"][0] + 0.3
    assert after["accuracy"][1] > 0.6 and min(after["hit_at_10"]) > 0.8


def test_a_stopped_run_resumes_exactly(tmp_path):
    windows = SequenceWindows(_synthetic_shard(num_seqs=12), 12)
    recipe = JetSpecRecipe(steps=12, batch_size=4, window=12, anchors=4, warmup=3, checkpoint_every=6)
    check_resume_is_exact(train_jetspec, _head, windows, recipe, replace(recipe, temperature=2.0), tmp_path)
    with pytest.raises(ValueError, match="anchors must be >= 1"):
        JetSpecRecipe(anchors=0)
    for t in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="temperature must be > 0"):
            JetSpecRecipe(temperature=t)
    window, head = windows.batch([0, 1]), _head()
    assert torch.equal(jetspec_loss(head, window, recipe, 3), jetspec_loss(head, window, recipe, 3))
