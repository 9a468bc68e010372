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

The counts and the cap are the request's `ReachRecord`, kept in its own record by the engine
(engine/request_table.py), so they are freed with the request; `ReachCap` holds only settings.

Why per request and not per sampling class: the cap then depends on the request's own history
only, so it adds no dependence on other traffic. A seeded request keeps sampling the same tokens
whatever else the server runs, as far as its drafter and budget mode allow (a fixed budget and a
drafter without an online layer; verify/coins.py keeps its random stream independent of the
batch). A cap shared by a class would not: the tree shape decides which coins sample which token.
It also fits each request's own temperature, filters and text. Pure Python and numpy: no vLLM.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["ReachCap", "ReachRecord", "GREEDY", "SAMPLED", "observe_depths"]

GREEDY, SAMPLED = "greedy", "sampled"


def observe_depths(reached: np.ndarray, hit: np.ndarray, decay: float, depth: int, accepted: int) -> bool:
    """Add one verified draft (deepest node `depth`, accepted path length `accepted`) to decayed
    counts by depth (float [max_depth] each, index d - 1, updated in place): every depth up to the
    accepted length + 1 was reached, every depth up to the accepted length accepted. False
    (nothing added, nothing decayed) for a draft without nodes."""
    depth = min(int(depth), len(reached))
    if depth < 1:
        return False
    acc = min(int(accepted), depth)
    reached *= 1.0 - decay
    hit *= 1.0 - decay
    reached[:min(acc + 1, depth)] += 1.0
    hit[:acc] += 1.0
    return True


@dataclass(eq=False)
class ReachRecord:
    """One request's acceptance by depth. It lives in the request's own record
    (engine/request_table.py) and is freed with it: `ReachCap` keeps no per-request state."""
    reached: np.ndarray     # float [max_depth]: decayed count of its drafts that reached depth d (index d - 1)
    accepted: np.ndarray    # float [max_depth]: decayed count of those accepted at depth d
    cap: int                # the most draft nodes it gets (max_depth until a draft of it was observed)


class ReachCap:
    """See the module docstring. `max_depth`: the deepest draft any request can have;
    `prior`/`prior_weight`: the conditional acceptance assumed before a request's observations
    (optimistic, so it drafts fully first); `decay`: the weight its counts lose per observed step
    (recent steps dominate); `keeps_caps`: whether `observe` updates each record's cap (budget.gain
    reads only `reach`, and recomputing a cap it never reads cost every verified request a few
    numpy calls per step). The rule holds only these settings; each request's counts and cap
    are its `ReachRecord` (`new_record`), which the caller keeps with the request."""

    def __init__(self, floor: float, max_depth: int, *, prior: float = 0.9, prior_weight: float = 1.0,
                 decay: float = 0.02, keeps_caps: bool = True) -> None:
        if not 0.0 < floor < 1.0:
            raise ValueError(f"floor must be in (0, 1), got {floor}")
        if max_depth < 1 or not 0.0 < prior <= 1.0 or prior_weight <= 0 or not 0.0 <= decay < 1.0:
            raise ValueError("need max_depth >= 1, 0 < prior <= 1, prior_weight > 0, 0 <= decay < 1")
        self.floor, self.max_depth = float(floor), int(max_depth)
        self.prior, self.prior_weight, self.decay = float(prior), float(prior_weight), float(decay)
        self.keeps_caps = bool(keeps_caps)

    @staticmethod
    def sampling_class(temperature: float | None) -> str:
        """greedy below vLLM's sampling epsilon (1e-5), sampled otherwise (None: greedy)."""
        return GREEDY if temperature is None or float(temperature) < 1e-5 else SAMPLED

    def new_record(self) -> ReachRecord:
        """A request's record before any of its drafts was observed (no counts, full cap)."""
        return ReachRecord(np.zeros(self.max_depth), np.zeros(self.max_depth), self.max_depth)

    def cap(self, record: ReachRecord | None) -> int:
        """The most draft nodes the request gets (1..max_depth; max_depth before it was observed,
        or without a record yet)."""
        return self.max_depth if record is None else record.cap

    def reach(self, record: ReachRecord | None, prior: np.ndarray | None = None) -> np.ndarray:
        """float [max_depth]: the estimated probability that the request accepts through depth d
        (index d - 1). `prior`: float [max_depth] conditional acceptance to assume where the
        request has no observations of its own (default: the constant `self.prior`)."""
        if record is None:
            record = self.new_record()
        w, p = self.prior_weight, self.prior if prior is None else prior
        return np.cumprod((record.accepted + p * w) / (record.reached + w))

    def reach_many(self, records: Sequence[ReachRecord]) -> np.ndarray:
        """float [len(records), max_depth]: `reach` of each record (constant prior), in one pass."""
        w = self.prior_weight
        accepted = np.stack([r.accepted for r in records])
        reached = np.stack([r.reached for r in records])
        return np.cumprod((accepted + self.prior * w) / (reached + w), axis=1)

    def observe(self, records: Sequence[ReachRecord], depths: Sequence[int], accepted: Sequence[int]) -> None:
        """One verified step: per drafted request, its record, its tree's deepest node depth and
        the length of its accepted path (bonus token not counted)."""
        if not len(records) == len(depths) == len(accepted):
            raise ValueError("records, depths and accepted need one entry per drafted request")
        for record, depth, acc in zip(records, depths, accepted):
            if observe_depths(record.reached, record.accepted, self.decay, depth, acc) and self.keeps_caps:
                record.cap = max(1, int(np.count_nonzero(self.reach(record) >= self.floor)))
