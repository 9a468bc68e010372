"""JetSpec head (drafters/heads/jetspec.py): the serving forward (per-request context K/V, one
batched block forward) gives the training forward's logits for the same prefix; context rows
after the prefix and (in causal mode) later block rows do not leak into a prediction; checkpoints
round-trip and a checkpoint of the wrong kind is refused naming drafter.type."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from test_dart_head import H, V, _data, make_random_head
from vllm_treespec.drafters.heads.jetspec import JetSpecConfig, JetSpecHead

pytestmark = pytest.mark.usefixtures("one_torch_thread")

def _head(within="causal", depth=4, seed=0, layers=2):
    return make_random_head(JetSpecConfig, JetSpecHead, seed, depth=depth, num_layers=layers, within_block=within)


def _all_prefixes(b, p):
    return torch.arange(p).expand(b, p)


@pytest.mark.parametrize("within", ["causal", "bidirectional"])
def test_serving_forward_equals_training_forward(within):
    head = _head(within)
    feats, toks = _data(2, 7)
    with torch.no_grad():
        train = torch.log_softmax(head.forward_train(feats, toks, _all_prefixes(2, 7)), -1)   # [2, 7, d, V]
        for n in range(1, 8):
            caches = []
            for b in range(2):
                cut = max(n - 2, 0)
                c = head.extend(head.new_cache(), feats[b, :cut], toks[b, :cut])
                c = head.extend(c, feats[b, cut:n], toks[b, cut:n])           # catch-up in two calls
                caches.append(c)
            torch.testing.assert_close(head.draft(caches), train[:, n - 1], rtol=1e-9, atol=1e-9)


def test_chosen_anchors_equal_all_anchors():
    head = _head()
    feats, toks = _data(2, 9, seed=4)
    with torch.no_grad():
        full = head.forward_train(feats, toks, _all_prefixes(2, 9))
        chosen = torch.tensor([[7, 0, 3], [2, 2, 8]])
        some = head.forward_train(feats, toks, chosen)
    torch.testing.assert_close(some, full[torch.arange(2)[:, None], chosen], rtol=1e-9, atol=1e-9)


def test_later_context_rows_do_not_leak():
    head = _head()
    feats, toks = _data(1, 8, seed=5)
    other = feats.clone()
    other[:, 5:] += 1.0
    with torch.no_grad():
        a = head.forward_train(feats, toks, torch.tensor([[4]]))
        b = head.forward_train(other, toks, torch.tensor([[4]]))
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_causal_block_rows_ignore_later_rows_bidirectional_ones_do_not():
    """One shared mask vector: a causal head of depth 6 predicts its first 4 depths exactly as the
    same weights at depth 4; with bidirectional attention the extra mask rows change them."""
    feats, toks = _data(1, 6, seed=6)
    for within, same in (("causal", True), ("bidirectional", False)):
        short, long = _head(within, depth=4), _head(within, depth=6)
        long.load_state_dict(short.state_dict())
        with torch.no_grad():
            a = short.forward_train(feats, toks, torch.tensor([[3]]))
            b = long.forward_train(feats, toks, torch.tensor([[3]]))[:, :, :4]
        assert torch.allclose(a, b, rtol=1e-9, atol=1e-9) == same, within


def test_ragged_batch_and_truncation():
    head = _head()
    feats, toks = _data(3, 9, seed=2)
    with torch.no_grad():
        caches = [head.extend(head.new_cache(), feats[i, :n], toks[i, :n]) for i, n in enumerate([9, 2, 5])]
        together = head.draft(caches)
        for i, c in enumerate(caches):
            torch.testing.assert_close(together[i], head.draft([c])[0], rtol=1e-9, atol=1e-9)
        cut = head.extend(head.truncate(caches[0], 4), feats[0, 4:6], toks[0, 4:6])
        fresh = head.extend(head.new_cache(), feats[0, :6], toks[0, :6])
        torch.testing.assert_close(head.draft([cut]), head.draft([fresh]), rtol=1e-9, atol=1e-9)
    with pytest.raises(ValueError, match="at least one context row"):
        head.draft([head.new_cache()])


@pytest.mark.parametrize("kwargs,match", [
    (dict(depth=0), "depth must be >= 1"), (dict(num_layers=0), "num_layers"),
    (dict(feature_layers=(0, 9)), "feature_layers"), (dict(within_block="sideways"), "within_block"),
    (dict(intermediate_size=0), "intermediate_size must be >= 1"), (dict(num_kv_heads=0), "num_kv_heads"),
])
def test_bad_configs(kwargs, match):
    base = dict(hidden_size=H, vocab_size=V, target_num_layers=6, feature_layers=(0, 1, 2))
    with pytest.raises(ValueError, match=match):
        JetSpecConfig(**{**base, **kwargs})


def test_checkpoint_round_trip_and_kind_check(tmp_path):
    from vllm_treespec.drafters.heads.checkpoint import HeadCheckpointError, load_head, save_head

    head = _head().float()
    assert not any(k.startswith("embed.") for k in head.trainable_state())
    save_head(head, tmp_path / "ckpt")
    target = SimpleNamespace(hidden_size=H, vocab_size=V, num_hidden_layers=6)
    loaded = load_head(tmp_path / "ckpt", target, head.embed, kind="jetspec")
    assert isinstance(loaded, JetSpecHead) and loaded.config == head.config
    for k, v in head.trainable_state().items():
        assert torch.equal(loaded.trainable_state()[k], v)
    with pytest.raises(HeadCheckpointError, match="is a jetspec head; set drafter.type: jetspec"):
        load_head(tmp_path / "ckpt", target, head.embed, kind="dart")
