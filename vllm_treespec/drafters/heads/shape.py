"""What every head's config.json holds: the head's transformer shape and the target it reads
(hidden size, vocabulary, layer count, feature layers), with the checks and the JSON round trip
all head kinds share. Kinds add their own fields (heads/dart.py, heads/jetspec.py)."""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal, TypeVar

__all__ = ["HeadShape"]

T = TypeVar("T", bound="HeadShape")


@dataclass(frozen=True)
class HeadShape:
    hidden_size: int                 # = the target's hidden size (the embedding is shared)
    vocab_size: int                  # = the target's vocabulary
    target_num_layers: int
    feature_layers: tuple[int, ...]  # target layers whose hidden states are concatenated
    depth: int = 8                   # d: tokens predicted per forward
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 256
    rope_theta: float = 1e6
    rms_norm_eps: float = 1e-6
    within_block: Literal["causal", "bidirectional"] = "causal"

    def __post_init__(self) -> None:
        if self.within_block not in ("causal", "bidirectional"):
            raise ValueError(f"within_block must be causal or bidirectional, got {self.within_block!r}")
        for name in ("depth", "num_heads", "num_kv_heads", "head_dim", "intermediate_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        bad = [l for l in self.feature_layers if not 0 <= l < self.target_num_layers]
        if not self.feature_layers or bad:
            raise ValueError(f"feature_layers {list(self.feature_layers)} must be non-empty target "
                             f"layer ids in [0, {self.target_num_layers})")

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls: type[T], path: Path) -> T:
        raw = json.loads(path.read_text())
        raw["feature_layers"] = tuple(raw["feature_layers"])
        return cls(**raw)
