"""JetSpec training recipe (paper 001, section 2.3, App. D), also used for the diffusion-style head.

Each step samples random anchors in every window (without replacement, at most `anchors` per
window; JetSpec uses up to 512 per example). Anchor a is a block: the target's features of rows
0..a-1 as context, the token at a as the block's root, d mask rows predicting tokens a+1..a+d
(JetSpecHead.forward_train with prefix g = a - 1). The loss is the forward KL at temperature T
between the target's distribution on the same ground-truth prefix (the shards' top-K,
renormalised) and the head's, averaged uniformly over the active (anchor, depth) pairs (Eq. 9:
no depth weighting; the DFlash-style exponential weighting is an ablation we do not ship).
No T^2 factor: gradients are compared across T only through the recipe's own runs.

The anchors of step s are drawn from a generator seeded by (seed, s), so a resumed run draws
exactly what the uninterrupted run would have (train/loop.py restores everything else).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from vllm_treespec.drafters.heads.jetspec import JetSpecHead
from vllm_treespec.train.loop import distill_kl, train_loop
from vllm_treespec.train.shards import SequenceWindows, Window

__all__ = ["JetSpecRecipe", "sample_anchors", "jetspec_loss", "train_jetspec"]


@dataclass(frozen=True)
class JetSpecRecipe:
    steps: int = 300
    batch_size: int = 8
    window: int = 512              # whole sequences: what serving hands the head (benchmarks/treespec_fixtures/heads.py)
    anchors: int = 16              # random anchors (blocks) per window per step
    temperature: float = 1.0       # distillation temperature T
    lr: float = 1e-3
    warmup: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 0.5
    seed: int = 0
    checkpoint_every: int = 100

    def __post_init__(self) -> None:
        if self.anchors < 1:
            raise ValueError(f"anchors must be >= 1, got {self.anchors}")
        if not self.temperature > 0:
            raise ValueError(f"temperature must be > 0, got {self.temperature}")


def sample_anchors(valid: torch.Tensor, count: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(prefixes [B, A], active [B, A]): for each window with `valid` rows, up to `count` distinct
    prefixes g in [0, valid - 2] (the root x_{g+1} and at least one teacher row must exist),
    padded with 0 and marked inactive."""
    b = valid.shape[0]
    a = max(1, min(count, int(valid.max()) - 1))
    prefixes = torch.zeros((b, a), dtype=torch.int64)
    active = torch.zeros((b, a), dtype=torch.bool)
    for i in range(b):
        n = int(valid[i]) - 1                              # prefixes 0 .. valid-2
        if n <= 0:
            continue
        pick = torch.randperm(n, generator=generator)[:a]
        prefixes[i, :pick.numel()] = pick.sort().values
        active[i, :pick.numel()] = True
    return prefixes, active


def jetspec_loss(head: JetSpecHead, window: Window, recipe: JetSpecRecipe, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(recipe.seed * 1_000_003 + step)
    prefixes, active = sample_anchors(window.valid, recipe.anchors, g)
    logits = head.forward_train(window.features[:, :-1], window.tokens[:, 1:], prefixes)
    weights = torch.ones(head.config.depth)
    return distill_kl(logits, window, prefixes, weights, recipe.temperature, active)


def train_jetspec(head: JetSpecHead, windows: SequenceWindows, recipe: JetSpecRecipe, out_dir: Path, *,
                  resume: bool = True, progress: bool = True, stop_after: int | None = None) -> list[float]:
    """Train `head` in place (resuming from out_dir's state if present); returns this call's losses."""
    return train_loop(head, windows, recipe, out_dir,
                      lambda window, step: jetspec_loss(head, window, recipe, step),
                      desc=f"jetspec-{head.config.within_block}", resume=resume, progress=progress,
                      stop_after=stop_after)
