"""Per-request depth caps from measured acceptance (`budget.reach_floor`).

Why: a drafter's own confidence says how likely the target's *greedy* continuation is, not how
likely a *sampled* request is to accept it. At temperature 0.7 the code-LM fixture verified 1.66
tokens per step from 32-deep lookup-trie chains and 1.61 from 4-deep ones, so 28 of the verified
rows bought almost nothing (benchmarks/results/bench_paired_distilled32_vs_distilled4_t07_code-lm.json),
while greedy requests verify 6.78 tokens per step from the same chains. One budget cannot fit
both, so each request learns how deep its own drafts are accepted and stops drafting where it is
unlikely to get to.

Per request and depth d the cap keeps decayed counts of its verified drafts that reached depth d
(the accepted path had length >= d - 1 and the tree had a node at depth d) and of those that
accepted a node there. The conditional acceptance at d is (accepted + prior * w) / (reached + w),
the probability of reaching d is the product over depths 1..d, and the cap is the deepest d whose
reach probability is at least the floor (never below 1, so acceptance keeps being measured). A
new request starts from the optimistic prior (it drafts fully), and depths it no longer tries
drift back towards the prior as their counts decay, so a lowered cap is tried deeper again when
acceptance rises. The cap bounds the request's node budget: a chain's nodes are its depth; a tree
is shrunk to that many nodes (and so to that depth at most).

Why per request and not per sampling class: the cap then depends on the request's own history
only, so it adds no dependence on other traffic. A seeded request keeps sampling the same tokens
whatever else the server runs, as far as its drafter and budget mode allow (a fixed budget and a
drafter without an online layer; verify/coins.py keeps its random stream independent of the
batch). A cap shared by a class would not: the tree shape decides which coins sample which token.
It also fits each request's own temperature, filters and text. Pure Python and numpy: no vLLM.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

__all__ = ["ReachCap", "GREEDY", "SAMPLED", "observe_depths"]

GREEDY, SAMPLED = "greedy", "sampled"


def observe_depths(counts: dict[str, tuple[np.ndarray, np.ndarray]], key: str, max_depth: int,
                   decay: float, depth: int, accepted: int) -> bool:
    """Add one verified draft (deepest node `depth`, accepted path length `accepted`) to the
    decayed (reached, accepted) counts by depth under `key`: every depth up to the accepted
    length + 1 was reached, every depth up to the accepted length accepted. False (nothing
    added) for a draft without nodes."""
    depth = min(int(depth), max_depth)
    if depth < 1:
        return False
    acc = min(int(accepted), depth)
    entry = counts.get(key)
    if entry is None:
        entry = counts[key] = (np.zeros(max_depth), np.zeros(max_depth))
    reached, hit = entry
    reached *= 1.0 - decay
    hit *= 1.0 - decay
    reached[:min(acc + 1, depth)] += 1.0
    hit[:acc] += 1.0
    return True


class ReachCap:
    """See the module docstring. `max_depth`: the deepest draft any request can have;
    `prior`/`prior_weight`: the conditional acceptance assumed before a request's observations
    (optimistic, so it drafts fully first); `decay`: the weight its counts lose per observed step
    (recent steps dominate)."""

    def __init__(self, floor: float, max_depth: int, *, prior: float = 0.9, prior_weight: float = 1.0,
                 decay: float = 0.02) -> None:
        if not 0.0 < floor < 1.0:
            raise ValueError(f"floor must be in (0, 1), got {floor}")
        if max_depth < 1 or not 0.0 < prior <= 1.0 or prior_weight <= 0 or not 0.0 <= decay < 1.0:
            raise ValueError("need max_depth >= 1, 0 < prior <= 1, prior_weight > 0, 0 <= decay < 1")
        self.floor, self.max_depth = float(floor), int(max_depth)
        self.prior, self.prior_weight, self.decay = float(prior), float(prior_weight), float(decay)
        self._counts: dict[str, tuple[np.ndarray, np.ndarray]] = {}   # req -> (reached, accepted)
        self._caps: dict[str, int] = {}

    @staticmethod
    def sampling_class(temperature: float | None) -> str:
        """greedy below vLLM's sampling epsilon (1e-5), sampled otherwise (None: greedy)."""
        return GREEDY if temperature is None or float(temperature) < 1e-5 else SAMPLED

    def cap(self, req_id: str) -> int:
        """The most draft nodes this request gets (1..max_depth; max_depth before it was observed)."""
        return self._caps.get(req_id, self.max_depth)

    def reach(self, req_id: str, prior: np.ndarray | None = None) -> np.ndarray:
        """float [max_depth]: the estimated probability that this request accepts through depth d
        (index d - 1). `prior`: float [max_depth] conditional acceptance to assume where the
        request has no observations of its own (default: the constant `self.prior`)."""
        reached, accepted = self._counts.get(req_id, (np.zeros(self.max_depth), np.zeros(self.max_depth)))
        w = self.prior_weight
        return np.cumprod((accepted + (self.prior if prior is None else prior) * w) / (reached + w))

    def observe(self, req_ids: Sequence[str], depths: Sequence[int], accepted: Sequence[int]) -> None:
        """One verified step: per drafted request, its tree's deepest node depth and the length of
        its accepted path (bonus token not counted)."""
        if not len(req_ids) == len(depths) == len(accepted):
            raise ValueError("req_ids, depths and accepted need one entry per drafted request")
        for req_id, depth, acc in zip(req_ids, depths, accepted):
            if not observe_depths(self._counts, req_id, self.max_depth, self.decay, depth, acc):
                continue
            self._caps[req_id] = max(1, int(np.count_nonzero(self.reach(req_id) >= self.floor)))

    def release(self, req_ids: Iterable[str]) -> None:
        """Forget finished or aborted requests."""
        for r in req_ids:
            self._counts.pop(r, None)
            self._caps.pop(r, None)

    def tracked(self) -> int:
        """Requests with a learnt cap."""
        return len(self._caps)

    def request_ids(self) -> set[str]:
        """The requests with a learnt cap."""
        return set(self._caps)
