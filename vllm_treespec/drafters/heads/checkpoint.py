"""Head checkpoints: a directory with config.json (the head's shape and its target's) and
model.safetensors (every trained tensor; the token embedding is the target's and is not saved).

Loading checks the head against the served target before any weight is used and fails with a
`HeadCheckpointError` naming the key and the fix: missing directory or files, a config that is
not a head's, or a target whose hidden size, vocabulary or layer count differs from the one the
head was trained on (its features would be read from the wrong layers or widths).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vllm_treespec.drafters.heads import HEAD_KINDS, DraftHead, HeadConfig
from vllm_treespec.schema import ConfigError

__all__ = ["HeadCheckpointError", "HeadKindMismatchError", "HeadTargetMismatchError", "save_head", "load_head",
           "check_head_dir", "check_target", "expected_state_shapes", "check_state_shapes"]

WEIGHTS = "model.safetensors"


class HeadCheckpointError(ConfigError):
    """A head checkpoint that cannot serve this target (message names the key and the fix).

    This base class is raised for an unusable checkpoint directory (missing, incomplete, not a
    head's config, weights that do not match it); the subclasses below tell a dry run
    (vllm_treespec.preflight) when the files are fine but the config or the target is not."""


class HeadKindMismatchError(HeadCheckpointError):
    """A valid head of another kind than drafter.type asks for (fix: the config)."""


class HeadTargetMismatchError(HeadCheckpointError):
    """A valid head trained for another target (hidden size, vocabulary or layer count)."""


def save_head(head: DraftHead, out_dir: Path, extra: dict[str, Any] | None = None) -> Path:
    """Write config.json and model.safetensors (and training metadata, if any, to head.json)."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    head.config.save(out_dir / "config.json")
    save_file({k: v.detach().contiguous().cpu() for k, v in head.trainable_state().items()},
              str(out_dir / WEIGHTS))
    if extra:
        (out_dir / "head.json").write_text(json.dumps(extra, indent=2) + "\n")
    return out_dir


def check_head_dir(path: str | Path, key: str = "drafter.path",
                   kind: str | None = None) -> tuple[Path, HeadConfig]:
    """The directory and its config, after the checks that need no target; ``kind``: the head
    kind the deployment asked for (drafter.type), checked against the checkpoint's."""
    d = Path(path)
    if not d.is_dir():
        raise HeadCheckpointError(f"{key}: {str(d)!r} is not a directory; point it at a head "
                                  "checkpoint (config.json + model.safetensors), e.g. one written "
                                  "by `vllm-treespec train`")
    for name in ("config.json", WEIGHTS):
        if not (d / name).is_file():
            raise HeadCheckpointError(f"{key}: {str(d)!r} has no {name}; copy the whole checkpoint "
                                      "directory")
    try:
        found = json.loads((d / "config.json").read_text()).get("kind", "dart")
        if found not in HEAD_KINDS:
            raise ValueError(f"unknown head kind {found!r}; known: {', '.join(HEAD_KINDS)}")
        config = HEAD_KINDS[found][0].load(d / "config.json")
    except (TypeError, ValueError, KeyError, AttributeError) as e:
        raise HeadCheckpointError(f"{key}: {str(d / 'config.json')!r} is not a draft-head config "
                                  f"({e})") from None
    if kind is not None and config.kind != kind:
        raise HeadKindMismatchError(f"{key}: {str(d)!r} is a {config.kind} head; set drafter.type: "
                                    f"{config.kind} or point drafter.path at a {kind} head")
    return d, config


def check_target(config: HeadConfig, target: Any, key: str = "drafter.path") -> None:
    """Raise HeadTargetMismatchError unless the head was trained for `target` (an object with
    hidden_size, vocab_size, num_hidden_layers: an HF config, or its config.json as a namespace)."""
    for name, mine, theirs in (("hidden_size", config.hidden_size, target.hidden_size),
                               ("vocab_size", config.vocab_size, target.vocab_size),
                               ("num_hidden_layers", config.target_num_layers, target.num_hidden_layers)):
        if int(mine) != int(theirs):
            raise HeadTargetMismatchError(
                f"{key}: the head was trained for a target with {name}={mine}, the served model has "
                f"{name}={theirs}; train a head for this model (`vllm-treespec train`) or serve the "
                "model it was trained on")


def expected_state_shapes(config: HeadConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor a checkpoint of `config` must hold, from a head built on
    torch's meta device: no memory and no weights, so a dry run can check a checkpoint's
    safetensors header without loading a tensor."""
    with torch.device("meta"):
        head = HEAD_KINDS[config.kind][1](config, nn.Embedding(config.vocab_size, config.hidden_size))
    return {k: tuple(v.shape) for k, v in head.trainable_state().items()}


def check_state_shapes(found: dict[str, tuple[int, ...]], expected: dict[str, tuple[int, ...]],
                       weights: Path, key: str = "drafter.path") -> None:
    """Raise HeadCheckpointError unless `found` (the checkpoint's tensor shapes) has exactly the
    tensors of `expected` with their shapes: weights written for another config.json."""
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    wrong = sorted(k for k in set(expected) & set(found) if tuple(found[k]) != tuple(expected[k]))
    if missing or unexpected or wrong:
        raise HeadCheckpointError(
            f"{key}: {str(weights)!r} does not match its config.json (missing {missing[:3]}, "
            f"unexpected {unexpected[:3]}, wrong shape {wrong[:3]}); re-export the checkpoint")


def load_head(path: str | Path, target_config: Any, embed: nn.Embedding, *,
              key: str = "drafter.path", dtype: torch.dtype | None = None,
              kind: str | None = None) -> DraftHead:
    """The head of checkpoint `path`, checked against the served target and sharing its embedding."""
    from safetensors.torch import load_file

    d, config = check_head_dir(path, key, kind)
    check_target(config, target_config, key)
    head = HEAD_KINDS[config.kind][1](config, embed)
    state = load_file(str(d / WEIGHTS))
    check_state_shapes({k: tuple(v.shape) for k, v in state.items()},
                       {k: tuple(v.shape) for k, v in head.trainable_state().items()}, d / WEIGHTS, key)
    head.load_state_dict(state, strict=False)
    head = head.eval().requires_grad_(False)
    return head.to(dtype) if dtype is not None else head
