"""Depth caps from measured acceptance, per sampling class (`budget.reach_floor`).

Why: a drafter's own confidence says how likely the target's *greedy* continuation is, not how
likely a *sampled* request is to accept it. At temperature 0.7 the code-LM fixture verified 1.66
tokens per step from 32-deep lookup-trie chains and 1.61 from 4-deep ones, so 28 of the verified
rows bought almost nothing (benchmarks/results/bench_paired_distilled32_vs_distilled4_t07_code-lm.json),
while greedy requests verify 6.78 tokens per step from the same chains. One budget cannot fit
both, so this cap learns each class's acceptance and stops drafting where a request of that
class is unlikely to get to.

Per class (greedy: temperature < 1e-5; sampled: the rest) and depth d it keeps decayed counts of
verified drafts that reached depth d (their accepted path had length >= d - 1 and the tree had a
node at depth d) and of those that accepted a node there. The conditional acceptance at d is
(accepted + prior * w) / (reached + w), the probability of reaching d is the product over depths
1..d, and the cap is the deepest d whose reach probability is at least the floor (never below 1,
so acceptance keeps being measured). Optimistic priors and decaying counts let unexplored depths
drift back towards the prior, so a cap that was lowered is tried deeper again when acceptance
rises. The cap bounds a request's node budget: a chain's nodes are its depth; a tree is shrunk
to that many nodes (and so to that depth at most). Pure Python and numpy: no vLLM.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

__all__ = ["ReachCap", "GREEDY", "SAMPLED"]

GREEDY, SAMPLED = "greedy", "sampled"


class ReachCap:
    """See the module docstring. `max_depth`: the deepest draft any request can have;
    `prior`/`prior_weight`: the conditional acceptance assumed before observations (optimistic,
    so new deployments draft fully first); `decay`: the weight lost by every count per observed
    step of the class (recent traffic dominates)."""

    def __init__(self, floor: float, max_depth: int, *, prior: float = 0.9, prior_weight: float = 4.0,
                 decay: float = 0.01) -> None:
        if not 0.0 < floor < 1.0:
            raise ValueError(f"floor must be in (0, 1), got {floor}")
        if max_depth < 1 or not 0.0 < prior <= 1.0 or prior_weight <= 0 or not 0.0 <= decay < 1.0:
            raise ValueError("need max_depth >= 1, 0 < prior <= 1, prior_weight > 0, 0 <= decay < 1")
        self.floor, self.max_depth = float(floor), int(max_depth)
        self.prior, self.prior_weight, self.decay = float(prior), float(prior_weight), float(decay)
        self.reached = {c: np.zeros(self.max_depth) for c in (GREEDY, SAMPLED)}
        self.accepted = {c: np.zeros(self.max_depth) for c in (GREEDY, SAMPLED)}
        self._caps = {c: self.max_depth for c in (GREEDY, SAMPLED)}

    @staticmethod
    def sampling_class(temperature: float | None) -> str:
        """greedy below vLLM's sampling epsilon (1e-5), sampled otherwise (None: greedy)."""
        return GREEDY if temperature is None or float(temperature) < 1e-5 else SAMPLED

    def cap(self, cls: str) -> int:
        """The most draft nodes a request of this class gets (1..max_depth)."""
        return self._caps[cls]

    def reach(self, cls: str) -> np.ndarray:
        """float [max_depth]: estimated probability that a request of this class accepts through
        depth d (index d - 1)."""
        w = self.prior_weight
        cond = (self.accepted[cls] + self.prior * w) / (self.reached[cls] + w)
        return np.cumprod(cond)

    def observe(self, classes: Sequence[str], depths: Sequence[int], accepted: Sequence[int]) -> None:
        """One verified step: per drafted request its class, its tree's deepest node depth and
        the length of its accepted path (bonus token not counted)."""
        if not len(classes) == len(depths) == len(accepted):
            raise ValueError("classes, depths and accepted need one entry per drafted request")
        seen: set[str] = set()
        for cls, depth, acc in zip(classes, depths, accepted):
            depth = min(int(depth), self.max_depth)
            acc = min(int(acc), depth)
            if depth < 1:
                continue
            if cls not in seen:
                self.reached[cls] *= 1.0 - self.decay
                self.accepted[cls] *= 1.0 - self.decay
                seen.add(cls)
            self.reached[cls][:min(acc + 1, depth)] += 1.0
            self.accepted[cls][:acc] += 1.0
        for cls in seen:
            self._caps[cls] = max(1, int(np.count_nonzero(self.reach(cls) >= self.floor)))

    def state(self) -> dict[str, int]:
        """Current caps per class, for logs and metrics."""
        return dict(self._caps)
