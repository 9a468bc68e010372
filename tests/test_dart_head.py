"""DART head (drafters/heads/dart.py): the serving forward (per-request K/V cache of prefix rows,
one batched draft) gives the training forward's logits for the same prefix, for every prefix
length, in both within-block modes; config and shape errors name the problem."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from vllm_treespec.drafters.heads.dart import DartConfig, DartHead, eagle3_layers

pytestmark = pytest.mark.usefixtures("one_torch_thread")

V, H = 37, 32


def make_random_head(config_cls, head_cls, seed=0, **fields):
    """A float64 head of any kind with weights perturbed so that mask rows and attention matter."""
    torch.manual_seed(seed)
    cfg = config_cls(**{**dict(hidden_size=H, vocab_size=V, target_num_layers=6, feature_layers=(0, 1, 2),
                               num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48), **fields})
    head = head_cls(cfg, nn.Embedding(V, H)).double().eval()
    with torch.no_grad():
        for p in head.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    return head


def _head(within="causal", depth=4, seed=0, shifted=True):
    return make_random_head(DartConfig, DartHead, seed, depth=depth, within_block=within, shifted=shifted)


def _data(b, p, seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, p, 3 * H, generator=g, dtype=torch.float64),
            torch.randint(0, V, (b, p), generator=g))


@pytest.mark.parametrize("within,shifted", [("causal", True), ("bidirectional", True), ("causal", False)])
def test_serving_forward_equals_training_forward(within, shifted):
    head = _head(within, shifted=shifted)
    feats, toks = _data(2, 7)
    with torch.no_grad():
        train = torch.log_softmax(head.forward_train(feats, toks), -1)       # [2, 7, d, V]
        assert train.shape[2] == head.config.depth
        for n in range(1, 8):
            caches = []
            for b in range(2):
                c = head.new_cache()
                c = head.extend(c, feats[b, :n - 2 if n > 2 else 0], toks[b, :n - 2 if n > 2 else 0])
                c = head.extend(c, feats[b, c.length:n], toks[b, c.length:n])   # catch-up in two calls
                caches.append(c)
            served = head.draft(caches)
            torch.testing.assert_close(served, train[:, n - 1], rtol=1e-9, atol=1e-9)


def test_ragged_batch_equals_one_request_at_a_time():
    head = _head()
    feats, toks = _data(3, 9, seed=2)
    lengths = [9, 2, 5]
    with torch.no_grad():
        caches = [head.extend(head.new_cache(), feats[i, :n], toks[i, :n]) for i, n in enumerate(lengths)]
        together = head.draft(caches)
        for i, c in enumerate(caches):
            torch.testing.assert_close(together[i], head.draft([c])[0], rtol=1e-9, atol=1e-9)


def test_padding_rows_do_not_change_valid_rows():
    head = _head()
    feats, toks = _data(1, 6, seed=3)
    with torch.no_grad():
        full = head.forward_train(feats, toks)
        padded = head.forward_train(torch.cat([feats, feats[:, :2]], 1), torch.cat([toks, toks[:, :2]], 1),
                                    valid_len=torch.tensor([6]))
    torch.testing.assert_close(padded[:, :6], full, rtol=1e-9, atol=1e-9)


def test_checkpoint_state_excludes_the_shared_embedding(tmp_path):
    head = _head()
    assert not any(k.startswith("embed.") for k in head.trainable_state())
    head.config.save(tmp_path / "config.json")
    assert DartConfig.load(tmp_path / "config.json") == head.config


@pytest.mark.parametrize("kwargs,match", [
    (dict(depth=1), "depth must be >= 2"),
    (dict(feature_layers=(0, 9)), "feature_layers"),
])
def test_bad_configs(kwargs, match):
    base = dict(hidden_size=H, vocab_size=V, target_num_layers=6, feature_layers=(0, 1, 2))
    with pytest.raises(ValueError, match=match):
        DartConfig(**{**base, **kwargs})


def test_embedding_must_match_the_target():
    cfg = DartConfig(hidden_size=H, vocab_size=V, target_num_layers=6, feature_layers=(0, 1, 2))
    with pytest.raises(ValueError, match="target embedding"):
        DartHead(cfg, nn.Embedding(V + 1, H))
    assert eagle3_layers(32) == (1, 15, 28) and eagle3_layers(3) == (0, 1) and eagle3_layers(2) == (0,)


def test_checkpoint_round_trip_and_target_errors(tmp_path):
    from types import SimpleNamespace

    from vllm_treespec.drafters.heads.checkpoint import HeadCheckpointError, load_head, save_head

    head = _head().float()
    embed = head.embed
    save_head(head, tmp_path / "ckpt", extra={"recipe": "test"})
    target = SimpleNamespace(hidden_size=H, vocab_size=V, num_hidden_layers=6)
    loaded = load_head(tmp_path / "ckpt", target, embed)
    feats, toks = _data(1, 5)
    with torch.no_grad():
        torch.testing.assert_close(loaded.forward_train(feats.float(), toks), head.forward_train(feats.float(), toks))
    for name, value in (("hidden_size", H + 1), ("vocab_size", V + 3), ("num_hidden_layers", 8)):
        wrong = SimpleNamespace(**{**vars(target), name: value})
        with pytest.raises(HeadCheckpointError, match=f"drafter.path: .*{name}=.*train a head"):
            load_head(tmp_path / "ckpt", wrong, embed)
    with pytest.raises(HeadCheckpointError, match="is not a directory"):
        load_head(tmp_path / "nope", target, embed)
    (tmp_path / "ckpt" / "model.safetensors").rename(tmp_path / "w")
    with pytest.raises(HeadCheckpointError, match="has no model.safetensors"):
        load_head(tmp_path / "ckpt", target, embed)
    (tmp_path / "w").rename(tmp_path / "ckpt" / "model.safetensors")
    (tmp_path / "ckpt" / "config.json").write_text('{"hidden_size": 3}')
    with pytest.raises(HeadCheckpointError, match="not a draft-head config"):
        load_head(tmp_path / "ckpt", target, embed)
