"""The transformer draft LM runtime's cache and tree attention equal fresh HF forwards.

Drafter cache consistency (issue 7): after any sequence of accept/reject outcomes, the next-token
distribution equals a fresh forward over the committed tokens; every tree node's distribution
equals a fresh forward over context + its path.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_treespec.drafters.lm import DraftModelError
from vllm_treespec.drafters.lm.transformer import TransformerDraftLM

VOCAB = 97
TOL = dict(atol=2e-4, rtol=0)


def _qwen3(seed: int = 0):
    from treespec_fixtures.qwen3 import Qwen3Shape, new_model

    shape = Qwen3Shape(vocab_size=VOCAB, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                       head_dim=16, intermediate_size=96, max_position_embeddings=512)
    model = new_model(shape, eos_token_id=0, seed=seed, init_std=0.2)
    return model.eval()


def _llama(seed: int = 1):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
                      num_attention_heads=3, num_key_value_heads=1, max_position_embeddings=512,
                      initializer_range=0.2, architectures=["LlamaForCausalLM"])
    return LlamaForCausalLM(cfg).eval()


@torch.inference_mode()
def _fresh(model, seq) -> torch.Tensor:
    ids = torch.as_tensor(np.asarray(seq, dtype=np.int64))[None]
    return torch.log_softmax(model(input_ids=ids).logits[0, -1].float(), dim=-1)


def _random_tree_step(lm, model, rng, req_ids, contexts, levels=3, fan=2):
    """Start a step, expand `levels` levels (one extend per level over all requests), check
    every node against a fresh forward; returns each request's node paths."""
    root_lp = lm.start_step(req_ids, contexts)
    for i, ctx in enumerate(contexts):
        torch.testing.assert_close(root_lp[i], _fresh(model, ctx), **TOL)
    paths = [{0: ()} for _ in req_ids]
    frontier = [[0] for _ in req_ids]
    for _ in range(levels):
        req_index, parent, tokens = [], [], []
        for b in range(len(req_ids)):
            for v in frontier[b]:
                for tok in rng.choice(VOCAB, size=int(rng.integers(1, fan + 1)), replace=False):
                    req_index.append(b), parent.append(v), tokens.append(int(tok))
        order = rng.permutation(len(tokens))                 # any order across requests
        req_index = np.array(req_index)[order]
        parent = np.array(parent)[order]
        tokens = np.array(tokens)[order]
        lp = lm.extend(req_index, parent, tokens)
        frontier = [[] for _ in req_ids]
        for j, (b, p, tok) in enumerate(zip(req_index.tolist(), parent.tolist(), tokens.tolist())):
            node = len(paths[b])
            paths[b][node] = paths[b][p] + (tok,)
            frontier[b].append(node)
            torch.testing.assert_close(lp[j], _fresh(model, list(contexts[b]) + list(paths[b][node])), **TOL)
    return paths


@pytest.mark.parametrize("make", [_qwen3, _llama])
def test_tree_nodes_and_catch_up_equal_fresh_forwards(make):
    model = make()
    rng = np.random.default_rng(0)
    lm = TransformerDraftLM(model, max_requests=3, max_len=200, max_tree_nodes=40)
    req_ids = ["a", "b", "c"]
    contexts = [rng.integers(0, VOCAB, size=n).astype(np.int64) for n in (5, 17, 1)]
    assert lm.admit(req_ids).all()
    for _ in range(4):                                     # steps: accept a path + bonus, repeat
        paths = _random_tree_step(lm, model, rng, req_ids, contexts)
        for b in range(3):
            nodes = list(paths[b].values())
            accepted = nodes[int(rng.integers(0, len(nodes)))]  # any node's path (root = reject all)
            bonus = int(rng.integers(0, VOCAB))
            contexts[b] = np.concatenate([contexts[b], accepted, [bonus]]).astype(np.int64)
            assert lm.cached_tokens(req_ids[b]) == len(contexts[b]) - len(accepted) - 1


def test_one_request_steps_use_its_own_slot():
    """Steps with a single request take the no-gather path (cache views of its slot): trees and
    catch-ups there equal fresh forwards too, for a slot other than 0 and after other requests'
    steps wrote their slots."""
    model = _qwen3(seed=5)
    rng = np.random.default_rng(2)
    lm = TransformerDraftLM(model, max_requests=3, max_len=200, max_tree_nodes=40)
    req_ids = ["a", "b", "c"]
    contexts = [rng.integers(0, VOCAB, size=n).astype(np.int64) for n in (9, 21, 4)]
    assert lm.admit(req_ids).all()
    _random_tree_step(lm, model, rng, req_ids, contexts)            # every slot holds a cache
    for step in range(4):
        b = [1, 2, 1, 0][step]
        paths = _random_tree_step(lm, model, rng, [req_ids[b]], [contexts[b]])
        nodes = list(paths[0].values())
        accepted = nodes[int(rng.integers(0, len(nodes)))]
        contexts[b] = np.concatenate([contexts[b], accepted, [int(rng.integers(0, VOCAB))]]).astype(np.int64)


def test_diverged_context_and_unchanged_context_resync():
    model = _qwen3(seed=3)
    rng = np.random.default_rng(1)
    lm = TransformerDraftLM(model, max_requests=1, max_len=100, max_tree_nodes=8)
    ctx = rng.integers(0, VOCAB, size=30)
    lm.admit(["r"])
    torch.testing.assert_close(lm.start_step(["r"], [ctx])[0], _fresh(model, ctx), **TOL)
    torch.testing.assert_close(lm.start_step(["r"], [ctx])[0], _fresh(model, ctx), **TOL)   # no new tokens
    other = ctx.copy()
    other[10:] = rng.integers(0, VOCAB, size=20)              # a request id reused for other text
    torch.testing.assert_close(lm.start_step(["r"], [other])[0], _fresh(model, other), **TOL)
    shorter = other[:12]                                      # preempted and resumed shorter
    torch.testing.assert_close(lm.start_step(["r"], [shorter])[0], _fresh(model, shorter), **TOL)


def test_slots_evict_least_recently_used_outside_the_step():
    lm = TransformerDraftLM(_qwen3(), max_requests=2, max_len=50, max_tree_nodes=4)
    ctx = np.arange(1, 9)
    assert lm.admit(["a", "b"]).tolist() == [True, True]
    lm.start_step(["a", "b"], [ctx, ctx])
    assert lm.admit(["a", "b", "c"]).tolist() == [True, True, False]   # all in the step: no room
    assert lm.admit(["c"]).tolist() == [True]                           # evicts "a" (least recent)
    assert lm.cached_tokens("a") == 0 and lm.cached_tokens("b") == 8 and lm.cached_tokens("c") == 0
    lm.release(["b"])
    assert lm.cached_tokens("b") == 0 and lm.admit(["a"]).tolist() == [True]


def test_bad_calls_raise_clear_errors():
    lm = TransformerDraftLM(_qwen3(), max_requests=1, max_len=20, max_tree_nodes=3)
    with pytest.raises(KeyError, match="admit"):
        lm.start_step(["x"], [np.arange(3)])
    lm.admit(["x"])
    with pytest.raises(ValueError, match="1..20"):
        lm.start_step(["x"], [np.arange(21)])
    lm.start_step(["x"], [np.arange(3)])
    with pytest.raises(ValueError, match="does not exist"):
        lm.extend(np.array([0]), np.array([1]), np.array([5]))
    lm.extend(np.array([0, 0]), np.array([0, 0]), np.array([5, 6]))
    with pytest.raises(ValueError, match="exceed 3 tree nodes"):
        lm.extend(np.array([0]), np.array([1]), np.array([7]))


def test_unsupported_architecture_is_named():
    from transformers import GPT2Config, GPT2LMHeadModel

    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2,
                                       architectures=["GPT2LMHeadModel"]))
    with pytest.raises(DraftModelError, match="GPT2LMHeadModel.*supported: LlamaForCausalLM"):
        TransformerDraftLM(model, max_requests=1, max_len=20, max_tree_nodes=3)
