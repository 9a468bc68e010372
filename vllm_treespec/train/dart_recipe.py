"""DART training recipe (paper 000, section 3.3, section 5.3): prefix-shared masked training with
an annealed KL objective.

Every window of a training sequence trains all its prefixes at once (DartHead.forward_train with
the prefix-shared mask). The loss of prefix g at depth t is KL(p_t || q_t), p_t the target's
distribution at row g + t (its top-K, renormalised: what the shards keep), q_t the head's,
weighted by gamma^(t-1) (gamma = 0.6, the paper's best) and averaged over the valid (g, t) pairs.
AdamW, gradient clipping at 0.5, linear warm-up then cosine decay. Training state (head, optimiser,
schedule, step) is checkpointed so a run resumes exactly where it stopped: the batch order is a
function of the seed and the step.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from vllm_treespec.drafters.heads.dart import DartHead
from vllm_treespec.train.shards import SequenceWindows, Window

__all__ = ["DartRecipe", "dart_loss", "train_dart", "evaluate_head", "teacher_rows"]

STATE = "train_state.pt"


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


def teacher_rows(prefix_rows: int, depth: int, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row index [P, d] of the teacher of prefix g at depth t = g + t, mask [B, P, d] of pairs
    whose teacher row lies inside the window's valid rows)."""
    idx = torch.arange(prefix_rows)[:, None] + torch.arange(1, depth + 1)[None, :]
    ok = idx[None] <= (valid[:, None, None] - 1)
    return idx, ok


def dart_loss(logits: torch.Tensor, window: Window, gamma: float) -> torch.Tensor:
    """Annealed KL of head logits [B, P, d, V] (P = window rows - 1) against the window's teacher."""
    b, p, d, _ = logits.shape
    idx, ok = teacher_rows(p, d, window.valid)
    flat = idx.clamp(max=window.tokens.shape[1] - 1).reshape(-1)
    t_ids = window.topk_ids[:, flat].reshape(b, p, d, -1)
    t_lp = window.topk_logprobs[:, flat].reshape(b, p, d, -1)
    # renormalised top-K; -inf (padding) becomes a finite -1e9, so p = 0 there and padded rows
    # (weight 0) keep finite values and gradients
    t_lp = torch.log_softmax(t_lp.clamp(min=-1e9), -1)
    t_p = t_lp.exp()
    logq = torch.log_softmax(logits.float(), -1).gather(-1, t_ids)
    kl = (t_p * (t_lp - logq)).sum(-1)
    weights = gamma ** torch.arange(d, dtype=torch.float32)
    w = ok * weights
    return (kl * w).sum() / w.sum().clamp(min=1e-9)


def _head_logits(head: DartHead, window: Window) -> torch.Tensor:
    return head.forward_train(window.features[:, :-1], window.tokens[:, 1:], window.valid - 1)


def _schedule(recipe: DartRecipe) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < recipe.warmup:
            return (step + 1) / recipe.warmup
        progress = (step - recipe.warmup) / max(recipe.steps - recipe.warmup, 1)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return factor


def _batches(windows: SequenceWindows, recipe: DartRecipe, start: int):
    per_epoch = len(windows) // recipe.batch_size
    if per_epoch == 0:
        raise ValueError(f"{len(windows)} training windows cannot fill one batch of {recipe.batch_size}")
    step = start
    while True:
        epoch, k = divmod(step, per_epoch)
        order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(recipe.seed + epoch))
        yield windows.batch(order[k * recipe.batch_size:(k + 1) * recipe.batch_size].tolist())
        step += 1


def train_dart(head: DartHead, windows: SequenceWindows, recipe: DartRecipe, out_dir: Path, *,
               resume: bool = True, progress: bool = True, stop_after: int | None = None) -> list[float]:
    """Train `head` in place for recipe.steps steps (resuming from out_dir's state if present);
    returns the loss of every step run in this call. ``stop_after``: return (with the state
    saved) once this step is reached, e.g. to time-box a run; the next call continues."""
    out_dir.mkdir(parents=True, exist_ok=True)
    params = [p for n, p in head.named_parameters() if not n.startswith("embed.")]
    optim = torch.optim.AdamW(params, lr=recipe.lr, weight_decay=recipe.weight_decay)
    sched = torch.optim.lr_scheduler.LambdaLR(optim, _schedule(recipe))
    start = 0
    state_path = out_dir / STATE
    if resume and state_path.exists():
        state = torch.load(state_path, weights_only=False)
        if state["recipe"] != asdict(recipe):
            raise ValueError(f"{state_path}: saved with recipe {state['recipe']}, asked to resume with "
                             f"{asdict(recipe)}; use the same recipe or a fresh output directory")
        head.load_state_dict(state["head"], strict=False)
        optim.load_state_dict(state["optim"])
        sched.load_state_dict(state["sched"])
        start = state["step"]
    head.train()
    losses: list[float] = []
    batches = _batches(windows, recipe, start)
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=recipe.steps, initial=start, desc="dart", unit="step")
    end = recipe.steps if stop_after is None else min(recipe.steps, max(stop_after, start))
    for step in range(start, end):
        window = next(batches)
        loss = dart_loss(_head_logits(head, window), window, recipe.gamma)
        optim.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, recipe.grad_clip)
        optim.step()
        sched.step()
        losses.append(float(loss.detach()))
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{losses[-1]:.3f}")
        done = step + 1
        if done % recipe.checkpoint_every == 0 or done == end:
            torch.save({"step": done, "head": head.trainable_state(), "optim": optim.state_dict(),
                        "sched": sched.state_dict(), "recipe": asdict(recipe)}, state_path)
    if bar is not None:
        bar.close()
    head.eval()
    return losses


@torch.no_grad()
def evaluate_head(head: DartHead, windows: SequenceWindows, batch_size: int = 8,
                  max_batches: int | None = None) -> dict[str, list[float]]:
    """Per-depth accuracy (the head's top-1 equals the target's top-1) and hit@10 (the target's
    top-1 is among the head's top-10) over held-out windows, depth 1..d."""
    head.eval()
    d = head.config.depth
    hits1, hits10, total = torch.zeros(d), torch.zeros(d), torch.zeros(d)
    for k, start in enumerate(range(0, len(windows), batch_size)):
        if max_batches is not None and k >= max_batches:
            break
        window = windows.batch(list(range(start, min(start + batch_size, len(windows)))))
        logits = _head_logits(head, window)
        b, p = logits.shape[:2]
        idx, ok = teacher_rows(p, d, window.valid)
        target = window.topk_ids[:, idx.clamp(max=window.tokens.shape[1] - 1).reshape(-1), 0].reshape(b, p, d)
        top10 = logits.topk(min(10, logits.shape[-1]), -1).indices
        hits1 += ((top10[..., 0] == target) & ok).sum((0, 1)).float()
        hits10 += ((top10 == target[..., None]).any(-1) & ok).sum((0, 1)).float()
        total += ok.sum((0, 1)).float()
    total = total.clamp(min=1)
    return {"accuracy": (hits1 / total).tolist(), "hit_at_10": (hits10 / total).tolist()}
