"""DART training recipe (paper 000, section 3.3, section 5.3): prefix-shared masked training with
an annealed KL objective.

Every window of a training sequence trains all its prefixes at once (DartHead.forward_train with
the prefix-shared mask). The loss of prefix g at depth t is KL(p_t || q_t), p_t the target's
distribution at row g + t (its top-K, renormalised: what the shards keep), q_t the head's,
weighted by gamma^(t-1) (gamma = 0.6, the paper's best) and averaged over the valid (g, t) pairs.
AdamW, gradient clipping at 0.5, linear warm-up then cosine decay. Training state (head, optimiser,
schedule, step) is checkpointed so a run resumes exactly where it stopped (train/loop.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from vllm_treespec.drafters.heads.dart import DartHead
from vllm_treespec.train.loop import distill_kl, evaluate_head, prefix_logits, teacher_rows, train_loop
from vllm_treespec.train.shards import SequenceWindows, Window

__all__ = ["DartRecipe", "dart_loss", "train_dart", "evaluate_head", "teacher_rows"]


@dataclass(frozen=True)
class DartRecipe:
    steps: int = 300
    batch_size: int = 8
    window: int = 64
    lr: float = 1e-3
    warmup: int = 20
    weight_decay: float = 0.0
    gamma: float = 0.6              # annealing of the per-depth KL weights
    grad_clip: float = 0.5
    seed: int = 0
    checkpoint_every: int = 100


def dart_loss(logits: torch.Tensor, window: Window, gamma: float) -> torch.Tensor:
    """Annealed KL of head logits [B, P, d, V] (every prefix; P = window rows - 1) against the
    window's teacher: depth t weighted gamma^(t-1)."""
    b, p, d, _ = logits.shape
    return distill_kl(logits, window, torch.arange(p).expand(b, p), gamma ** torch.arange(d, dtype=torch.float32))


def train_dart(head: DartHead, windows: SequenceWindows, recipe: DartRecipe, out_dir: Path, *,
               resume: bool = True, progress: bool = True, stop_after: int | None = None) -> list[float]:
    """Train `head` in place for recipe.steps steps (resuming from out_dir's state if present);
    returns the loss of every step run in this call (train/loop.py: optimiser, schedule, resume)."""
    return train_loop(head, windows, recipe, out_dir,
                      lambda window, step: dart_loss(prefix_logits(head, window), window, recipe.gamma),
                      desc="dart", resume=resume, progress=progress, stop_after=stop_after)
