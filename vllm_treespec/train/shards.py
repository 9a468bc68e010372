"""Training data of draft heads: target features and teacher distributions along token sequences.

A shard is one safetensors file with, for S sequences flattened to N rows:

- ``features``  float16 [N, F]: the target's hidden states at the head's feature layers,
  concatenated, at every position (row i: after reading token i);
- ``tokens``    int64 [N]: the token at each position;
- ``topk_ids``  int64 [N, K] and ``topk_logprobs`` float32 [N, K]: the target's top-K next-token
  distribution at each position (row i predicts token i+1);
- ``seq_offsets`` int64 [S + 1]: where each sequence starts.

`SequenceWindows` cuts sequences into windows for training: window rows are prefix rows of the
prefix-shared layout (train/masks.py), and the teacher of prefix row g at depth t is row g + t.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import torch

__all__ = ["FeatureShard", "SequenceWindows", "Window", "load_shards", "save_shard"]

_KEYS = ("features", "tokens", "topk_ids", "topk_logprobs", "seq_offsets")


@dataclass
class FeatureShard:
    features: torch.Tensor
    tokens: torch.Tensor
    topk_ids: torch.Tensor
    topk_logprobs: torch.Tensor
    seq_offsets: torch.Tensor

    def __post_init__(self) -> None:
        n = self.tokens.shape[0]
        shapes = {k: tuple(getattr(self, k).shape) for k in _KEYS}
        if (self.features.shape[0] != n or self.topk_ids.shape[0] != n
                or self.topk_logprobs.shape != self.topk_ids.shape or self.seq_offsets.dim() != 1
                or int(self.seq_offsets[0]) != 0 or int(self.seq_offsets[-1]) != n
                or bool((self.seq_offsets[1:] < self.seq_offsets[:-1]).any())):
            raise ValueError(f"inconsistent feature shard: {shapes}, seq_offsets from "
                             f"{int(self.seq_offsets[0])} to {int(self.seq_offsets[-1])} for {n} rows")

    @property
    def num_sequences(self) -> int:
        return self.seq_offsets.numel() - 1

    def subset(self, keep: torch.Tensor) -> "FeatureShard":
        """The sequences s with keep[s] True (bool [S]), in order, as one shard."""
        offs = self.seq_offsets
        spans = [torch.arange(int(offs[s]), int(offs[s + 1])) for s in torch.nonzero(keep).flatten().tolist()]
        rows = torch.cat(spans) if spans else torch.zeros(0, dtype=torch.int64)
        lengths = (offs[1:] - offs[:-1])[keep]
        return FeatureShard(self.features[rows], self.tokens[rows], self.topk_ids[rows],
                            self.topk_logprobs[rows], torch.cat([torch.zeros(1, dtype=torch.int64),
                                                                 lengths.cumsum(0)]))


def save_shard(shard: FeatureShard, path: Path) -> Path:
    from safetensors.torch import save_file

    path.parent.mkdir(parents=True, exist_ok=True)
    save_file({k: getattr(shard, k).contiguous() for k in _KEYS}, str(path))
    return path


def load_shards(paths: list[Path]) -> FeatureShard:
    """All shards concatenated into one (sequences in file order)."""
    from safetensors.torch import load_file

    if not paths:
        raise ValueError("no feature shards given; generate them first (vllm-treespec train data ...)")
    parts = [load_file(str(p)) for p in paths]
    for p, part in zip(paths, parts):
        missing = [k for k in _KEYS if k not in part]
        if missing:
            raise ValueError(f"{p}: not a feature shard (missing {missing})")
    offsets, base = [torch.zeros(1, dtype=torch.int64)], 0
    for part in parts:
        offsets.append(part["seq_offsets"][1:] + base)
        base += int(part["tokens"].shape[0])
    return FeatureShard(*(torch.cat([part[k] for part in parts]) for k in _KEYS[:4]),
                        seq_offsets=torch.cat(offsets))


@dataclass
class Window:
    """A batch of windows: features [B, W, F], tokens [B, W], teacher top-k [B, W, K] (ids and
    log-probs), valid [B] rows per window (the rest is padding)."""
    features: torch.Tensor
    tokens: torch.Tensor
    topk_ids: torch.Tensor
    topk_logprobs: torch.Tensor
    valid: torch.Tensor


class SequenceWindows:
    """Non-overlapping windows of ``window`` rows (the last one of a sequence may be shorter)."""

    def __init__(self, shard: FeatureShard, window: int) -> None:
        if window < 2:
            raise ValueError(f"window must be >= 2 rows, got {window}")
        self.shard, self.window = shard, window
        starts = []
        offs = shard.seq_offsets.tolist()
        for a, b in zip(offs[:-1], offs[1:]):
            starts += [(s, min(s + window, b)) for s in range(a, b - 1, window) if min(s + window, b) - s >= 2]
        self.spans = starts

    def __len__(self) -> int:
        return len(self.spans)

    def batch(self, indices: list[int]) -> Window:
        s, w = self.shard, self.window
        b = len(indices)
        feats = torch.zeros((b, w, s.features.shape[1]), dtype=torch.float32)
        toks = torch.zeros((b, w), dtype=torch.int64)
        ids = torch.zeros((b, w, s.topk_ids.shape[1]), dtype=torch.int64)
        lps = torch.full((b, w, s.topk_ids.shape[1]), -torch.inf)
        valid = torch.zeros(b, dtype=torch.int64)
        for j, i in enumerate(indices):
            a, e = self.spans[i]
            n = e - a
            feats[j, :n] = s.features[a:e].float()
            toks[j, :n] = s.tokens[a:e]
            ids[j, :n] = s.topk_ids[a:e]
            lps[j, :n] = s.topk_logprobs[a:e].float()
            valid[j] = n
        return Window(feats, toks, ids, lps, valid)

    def epochs(self, batch_size: int, seed: int) -> Iterator[Window]:
        """Shuffled batches forever (epoch after epoch, reshuffled with seed + epoch)."""
        epoch = 0
        while True:
            order = torch.randperm(len(self), generator=torch.Generator().manual_seed(seed + epoch)).tolist()
            for k in range(0, len(order) - batch_size + 1, batch_size):
                yield self.batch(order[k:k + batch_size])
            epoch += 1
