"""The SmolLM2 conversion's pure parts (benchmarks/treespec_fixtures/smollm2.py): tensor names,
the rotary row order llama.cpp's converter changes, and the converted fixture itself."""
from __future__ import annotations

import json

import numpy as np
import pytest

from treespec_fixtures import smollm2


def llama_cpp_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """What llama.cpp's convert_hf_to_gguf does to q/k rows (the reference the converter undoes)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@pytest.mark.parametrize("n_head,head_dim", [(9, 64), (3, 64), (2, 8)])
def test_unpermute_undoes_llama_cpp_permute(n_head, head_dim):
    w = np.random.default_rng(0).standard_normal((n_head * head_dim, 5)).astype(np.float32)
    assert np.array_equal(smollm2.unpermute_rope(llama_cpp_permute(w, n_head), n_head), w)
    assert not np.array_equal(llama_cpp_permute(w, n_head), w)


def test_hf_names():
    assert smollm2.hf_name("blk.3.attn_q.weight") == "model.layers.3.self_attn.q_proj.weight"
    assert smollm2.hf_name("blk.29.ffn_down.weight") == "model.layers.29.mlp.down_proj.weight"
    assert smollm2.hf_name("blk.0.ffn_norm.weight") == "model.layers.0.post_attention_layernorm.weight"
    assert smollm2.hf_name("token_embd.weight") == "model.embed_tokens.weight"
    assert smollm2.hf_name("output_norm.weight") == "model.norm.weight"


@pytest.mark.slow
def test_converted_fixture_is_smollm2(smollm2_fp32_model):
    """The fixture has the GGUF's architecture, its chat template and a tokenizer that renders
    ChatML with the control tokens as single tokens."""
    from transformers import AutoTokenizer

    cfg = json.loads((smollm2_fp32_model / "config.json").read_text())
    assert (cfg["num_hidden_layers"], cfg["hidden_size"], cfg["num_attention_heads"],
            cfg["num_key_value_heads"], cfg["vocab_size"]) == (30, 576, 9, 3, 49152)
    assert cfg["tie_word_embeddings"] and cfg["eos_token_id"] == 2
    tok = AutoTokenizer.from_pretrained(str(smollm2_fp32_model))
    text = tok.apply_chat_template([{"role": "user", "content": "Hi 123"}], add_generation_prompt=True, tokenize=False)
    assert text.startswith("<|im_start|>system\n") and text.endswith("<|im_start|>assistant\n")
    ids = tok(text, add_special_tokens=False).input_ids
    assert ids[0] == 1 and ids.count(2) == 2            # <|im_start|>, two <|im_end|>
    assert tok("123", add_special_tokens=False).input_ids == [tok.convert_tokens_to_ids(c) for c in "123"]
