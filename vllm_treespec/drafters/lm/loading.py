"""Opening a draft model directory for serving: every check that can fail runs at startup with a
message naming the config key and the fix (missing files, unsupported architecture, tokenizer
mismatch with the served model, memory bound), then the matching runtime is built.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vllm_treespec.drafters.lm.base import DraftLM, DraftModelError, DraftModelFileError, DraftModelMismatchError
from vllm_treespec.drafters.lm.mamba import SUPPORTED_ARCHITECTURES as MAMBA_ARCHITECTURES
from vllm_treespec.drafters.lm.transformer import TRANSFORMER_ARCHITECTURES

__all__ = ["DraftModelSpec", "DTYPES", "MAMBA_ARCHITECTURES", "resolve_model_dir", "check_draft_model",
           "check_draft_tokenizer", "weight_files", "load_draft_lm"]

# the drafter.dtype names of the config (draft models and heads; "auto" is resolved by each)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_MB = 1 << 20


@dataclass(frozen=True)
class DraftModelSpec:
    """What the drafter config asks of the runtime (see config.DraftModelConfig)."""
    path: str
    dtype: str = "auto"
    memory_mb: float = 2048.0
    max_cached_requests: int = 64


def resolve_drafter_path(path: str, kind: str = "model") -> Path:
    """drafter.path as a local path: a plain path expanded, a prefixed one (`fixture:NAME` of the
    source checkout's lab) through its registered resolver (vllm_treespec/paths.py), which may
    build it first. `kind`: "model", or the head kind ("dart", "jetspec") of a head checkpoint."""
    from vllm_treespec.paths import resolve_path

    try:
        return resolve_path(path, kind)
    except ValueError as e:
        raise DraftModelError(f"drafter.path: {e}") from None


def resolve_model_dir(path: str) -> Path:
    """A model directory, or a prefixed path its resolver gives (`fixture:NAME`)."""
    d = resolve_drafter_path(path)
    if not d.is_dir():
        raise DraftModelFileError(f"drafter.path: {str(d)!r} is not a directory; point it at a local "
                                  "Hugging Face model directory (config.json, weights, tokenizer files)")
    return d


def _read_config(d: Path) -> dict[str, Any]:
    cfg = d / "config.json"
    if not cfg.is_file():
        raise DraftModelFileError(f"drafter.path: {str(d)!r} has no config.json; it must be a Hugging "
                                  "Face model directory (save_pretrained output)")
    try:
        raw = json.loads(cfg.read_text())
    except (OSError, ValueError) as e:   # ValueError: bad JSON or bytes that are no UTF-8 text
        raise DraftModelFileError(f"drafter.path: {cfg} cannot be read as JSON: {e}") from None
    if not isinstance(raw, dict):
        raise DraftModelFileError(f"drafter.path: {cfg} is not a model config (a JSON object); copy the "
                                  "model directory again")
    return raw


def weight_files(d: Path) -> list[Path]:
    """The weight files a Hugging Face loader reads from `d`: *.safetensors, else
    pytorch_model*.bin (what the size check counts and a dry run opens)."""
    return sorted(d.glob("*.safetensors")) or sorted(d.glob("pytorch_model*.bin"))


def _check_weights(d: Path) -> int:
    """Bytes of the weight files; an error when there are none."""
    files = weight_files(d)
    if not files:
        raise DraftModelFileError(f"drafter.path: {str(d)!r} has no weights (*.safetensors or "
                                  "pytorch_model*.bin); copy the full model directory")
    return sum(f.stat().st_size for f in files)


def check_draft_tokenizer(d: Path, served_tokenizer: str | Path | None) -> None:
    """Raise unless the draft model in `d` has the served model's tokenizer (same fingerprint):
    DraftModelFileError when `d` has no loadable tokenizer, DraftModelMismatchError when it
    differs. No-op without a served tokenizer."""
    if served_tokenizer is None:
        return
    from vllm_treespec.ngram.fingerprint import short, tokenizer_fingerprint

    try:
        mine = tokenizer_fingerprint(d)
    except Exception as e:  # noqa: BLE001 - any loader failure means: no usable tokenizer
        raise DraftModelFileError(f"drafter.path: no tokenizer could be loaded from {str(d)!r} ({e}); the "
                                  "draft model directory must contain the tokenizer it was trained with") from None
    theirs = tokenizer_fingerprint(served_tokenizer)
    if mine != theirs:
        raise DraftModelMismatchError(f"drafter.path: the draft model's tokenizer ({short(mine)}) differs from "
                                      f"the served model's ({short(theirs)}); a draft model must share the "
                                      "target's tokenizer (same vocabulary and special tokens)")


def check_draft_model(spec: DraftModelSpec, served_tokenizer: str | None) -> tuple[Path, str, int]:
    """(directory, architecture, weight bytes) after the checks that need no weights loaded:
    directory, config.json, supported architecture, weight files, tokenizer = served model's."""
    d = resolve_model_dir(spec.path)
    raw = _read_config(d)
    arch = (raw.get("architectures") or ["<none>"])[0]
    supported = TRANSFORMER_ARCHITECTURES + MAMBA_ARCHITECTURES
    if arch not in supported:
        raise DraftModelFileError(f"drafter.path: architecture {arch!r} (config.json) is not supported; "
                                  f"supported: {', '.join(supported)}")
    weight_bytes = _check_weights(d)
    check_draft_tokenizer(d, served_tokenizer)
    return d, arch, weight_bytes


def load_draft_lm(spec: DraftModelSpec, *, served_tokenizer: str | None, max_len: int,
                  max_tree_nodes: int) -> DraftLM:
    """Check and load the draft model; cache slots = min(max_cached_requests, what memory_mb
    leaves after the weights)."""
    d, arch, weight_bytes = check_draft_model(spec, served_tokenizer)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(d))
    dtype = DTYPES.get(spec.dtype) or getattr(config, "dtype", None) or torch.float32
    if isinstance(dtype, str):
        dtype = DTYPES.get(dtype, torch.float32)
    elem_ratio = torch.empty((), dtype=dtype).element_size() / 4
    weights_mb = weight_bytes * max(elem_ratio, 0.5) / _MB      # checkpoint size in the serving dtype (approx.)
    mamba = None
    if arch in MAMBA_ARCHITECTURES:
        from vllm_treespec.drafters.lm.mamba import load_hf_mamba, state_bytes_per_request

        mamba = load_hf_mamba(d, dtype)
        per_slot_mb = state_bytes_per_request(mamba, max_tree_nodes) / _MB
    else:
        from vllm_treespec.drafters.lm.transformer import kv_bytes_per_slot

        per_slot_mb = kv_bytes_per_slot(config, max_len, max_tree_nodes, dtype) / _MB
    room = spec.memory_mb - weights_mb
    slots = min(spec.max_cached_requests, int(room // per_slot_mb) if room > 0 else 0)
    if slots < 1:
        raise DraftModelError(
            f"drafter.memory_mb: {spec.memory_mb:g} MB cannot hold the draft model ({weights_mb:.1f} MB of "
            f"weights) plus one request's cache ({per_slot_mb:.1f} MB at max_model_len {max_len}); raise "
            "drafter.memory_mb, lower max_model_len or choose a smaller draft model")
    if mamba is not None:
        from vllm_treespec.drafters.lm.mamba import MambaDraftLM

        return MambaDraftLM(mamba, max_requests=slots, max_tree_nodes=max_tree_nodes,
                            max_state_bytes=int(spec.memory_mb * _MB))
    from transformers import AutoModelForCausalLM

    from vllm_treespec.drafters.lm.transformer import TransformerDraftLM

    model = AutoModelForCausalLM.from_pretrained(str(d), dtype=dtype).eval()
    return TransformerDraftLM(model, max_requests=slots, max_len=max_len, max_tree_nodes=max_tree_nodes)
