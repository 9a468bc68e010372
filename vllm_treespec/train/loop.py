"""The optimisation loop every head recipe shares: AdamW over the head's own parameters (the
shared target embedding stays frozen), gradient clipping, linear warm-up then cosine decay, a
progress bar, and checkpointed training state (head, optimiser, schedule, step) so a run resumes
exactly where it stopped: the batch order, and any randomness a recipe's loss draws, is a function
of the seed and the step. Also the per-depth evaluation all heads report.
"""
from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch import nn

from vllm_treespec.train.shards import SequenceWindows, Window

__all__ = ["train_loop", "distill_kl", "evaluate_head", "prefix_logits", "teacher_rows", "STATE"]

STATE = "train_state.pt"


def _schedule(recipe: Any) -> Callable[[int], float]:
    def factor(step: int) -> float:
        if step < recipe.warmup:
            return (step + 1) / recipe.warmup
        progress = (step - recipe.warmup) / max(recipe.steps - recipe.warmup, 1)
        return 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return factor


def _batches(windows: SequenceWindows, recipe: Any, start: int) -> Iterator[Window]:
    per_epoch = len(windows) // recipe.batch_size
    if per_epoch == 0:
        raise ValueError(f"{len(windows)} training windows cannot fill one batch of {recipe.batch_size}")
    step = start
    while True:
        epoch, k = divmod(step, per_epoch)
        order = torch.randperm(len(windows), generator=torch.Generator().manual_seed(recipe.seed + epoch))
        yield windows.batch(order[k * recipe.batch_size:(k + 1) * recipe.batch_size].tolist())
        step += 1


def train_loop(head: nn.Module, windows: SequenceWindows, recipe: Any, out_dir: Path,
               loss_fn: Callable[[Window, int], torch.Tensor], *, desc: str, resume: bool = True,
               progress: bool = True, stop_after: int | None = None) -> list[float]:
    """Run recipe.steps steps of loss_fn(window, step) on `head` in place (resuming from out_dir's
    state if present); returns the loss of every step run in this call. ``stop_after``: return
    (with the state saved) once this step is reached, e.g. to time-box a run.

    recipe: a dataclass with steps, batch_size, lr, warmup, weight_decay, grad_clip, seed and
    checkpoint_every; resuming with a different recipe is refused."""
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

        bar = tqdm(total=recipe.steps, initial=start, desc=desc, unit="step")
    end = recipe.steps if stop_after is None else min(recipe.steps, max(stop_after, start))
    for step in range(start, end):
        loss = loss_fn(next(batches), step)
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


def teacher_rows(prefix_rows: int, depth: int, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row index [P, d] of the teacher of prefix g at depth t = g + t, mask [B, P, d] of pairs
    whose teacher row lies inside the window's valid rows)."""
    idx = torch.arange(prefix_rows)[:, None] + torch.arange(1, depth + 1)[None, :]
    ok = idx[None] <= (valid[:, None, None] - 1)
    return idx, ok


def distill_kl(logits: torch.Tensor, window: Window, prefixes: torch.Tensor, depth_weights: torch.Tensor,
               temperature: float = 1.0, active: torch.Tensor | None = None) -> torch.Tensor:
    """Forward KL(p_T || q_T) of head logits [B, A, d, V] for prefixes [B, A] of the window's rows,
    weighted per depth and averaged over the (prefix, depth) pairs whose teacher exists.

    The teacher of prefix g at depth t is row g + t's top-K (renormalised: what the shards keep),
    sharpened or flattened by 1/T like the head's logits; ``active`` [B, A] masks padding prefixes."""
    b, a, d, _ = logits.shape
    idx = prefixes[..., None] + torch.arange(1, d + 1)                         # [B, A, d]
    ok = idx <= (window.valid[:, None, None] - 1)
    if active is not None:
        ok = ok & active[..., None]
    flat = idx.clamp(max=window.tokens.shape[1] - 1).reshape(b, -1)
    k = window.topk_ids.shape[-1]
    t_ids = window.topk_ids.gather(1, flat[..., None].expand(-1, -1, k)).reshape(b, a, d, k)
    t_lp = window.topk_logprobs.gather(1, flat[..., None].expand(-1, -1, k)).reshape(b, a, d, k)
    # -inf (padding) becomes a finite -1e9, so p = 0 there and padded rows (weight 0) keep finite
    # values and gradients
    t_lp = torch.log_softmax(t_lp.clamp(min=-1e9) / temperature, -1)
    logq = torch.log_softmax(logits.float() / temperature, -1).gather(-1, t_ids)
    kl = (t_lp.exp() * (t_lp - logq)).sum(-1)
    w = ok * depth_weights
    return (kl * w).sum() / w.sum().clamp(min=1e-9)


def prefix_logits(head: nn.Module, window: Window, chunk: int = 16) -> torch.Tensor:
    """Logits [B, P, d, V] of every prefix g of the window (P = rows - 1): the DART head runs them
    all in one prefix-shared pass, a JetSpec head in blocks of `chunk` anchors."""
    from vllm_treespec.drafters.heads.dart import DartHead

    feats, nxt = window.features[:, :-1], window.tokens[:, 1:]
    if isinstance(head, DartHead):
        return head.forward_train(feats, nxt, window.valid - 1)
    b, p = nxt.shape
    parts = [head.forward_train(feats, nxt, torch.arange(s, min(s + chunk, p)).expand(b, -1))
             for s in range(0, p, chunk)]
    return torch.cat(parts, 1)


@torch.no_grad()
def evaluate_head(head: nn.Module, windows: SequenceWindows, batch_size: int = 8,
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
        logits = prefix_logits(head, window)
        b, p = logits.shape[:2]
        idx, ok = teacher_rows(p, d, window.valid)
        target = window.topk_ids[:, idx.clamp(max=window.tokens.shape[1] - 1).reshape(-1), 0].reshape(b, p, d)
        top10 = logits.topk(min(10, logits.shape[-1]), -1).indices
        hits1 += ((top10[..., 0] == target) & ok).sum((0, 1)).float()
        hits10 += ((top10 == target[..., None]).any(-1) & ok).sum((0, 1)).float()
        total += ok.sum((0, 1)).float()
    total = total.clamp(min=1)
    return {"accuracy": (hits1 / total).tolist(), "hit_at_10": (hits10 / total).tolist()}
