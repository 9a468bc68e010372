"""Draft confidence, calibrated online (`budget.gain.confidence`): what a drafted node is worth,
read from the drafter's own rating of it this step, not from the request's past.

Why: a request's history says little about its next step when acceptance comes in bursts. A
model-free drafter matching a request against earlier answers is right for 20 tokens while the
request repeats one and wrong as soon as it stops; gain control by history alone (budget/gain.py)
stops such a request after a miss and waits for a probe, and served at 8 greedy clients it drafted
in 43% of its decisions where the drafter had a draft in 95% of steps
(docs/never-slower.md, "Drafts priced by their own confidence"). The drafter already rates each
node: `DraftTree.logprob` is its log-probability of the node's token given its path, so the path
probability of node i is the product along its path. That rating ranks well but is not a
probability of acceptance (replayed on unseen code, nodes rated 0.95 and above were accepted 79%
of the time, nodes rated 0.1-0.15 9%), so it is calibrated online: per class (the engine rates
greedy requests only) and path-probability bin, the decayed counts of verified nodes and of
those accepted. A node's worth is its bin's acceptance rate, made non-decreasing in the
rating (a node rated higher is never worth less: adjacent bins that break the order are pooled,
weighted by how much each has seen), and a tree is kept up to the first node worth
less than a verified row costs (`keep_prefixes`).

A rating means different things by where it came from: the lookup-trie drafter rates a
continuation of the request's matched suffix and a guess of its n-gram trie alone on one scale.
Replayed on SmolLM2 chat at 8 requests with one pooled curve, the trie's guesses rated 0.95-1
were accepted 4% of the time and match continuations rated 0.80-0.85 64%
(`replay_tau_sources_c8_smollm2-135m.json`, the pooled row's `ratings_by_source`): in one
non-decreasing curve the first drag the second down, and at a row price above the pooled rate
both are cut. So each node's `DraftTree.source` keeps its own curve (the same replay: 1.27x
modeled against 1.24x pooled at 8 requests, 1.53x against 1.50x at one; on the code-LM
fixture the two tie, `replay_tau_sources_c{1,8}_code-lm.json`).

Nodes below that cost are never verified, so their bins keep their prior (the rating itself:
optimistic, so drafting starts at once and learns from its first steps, as the greedy prior of
budget/reach.py does).

Pure numpy: no vLLM.
"""
from __future__ import annotations

import numpy as np

from vllm_treespec.tree import DraftTree
from vllm_treespec.tree.ancestors import local_index

__all__ = ["DraftCalibration", "GREEDY_CLASS", "batch_path_probs", "batch_sources", "keep_prefixes", "path_probs"]

GREEDY_CLASS = "greedy"       # the calibration class of greedy requests


def path_probs(tree: DraftTree) -> np.ndarray:
    """float64 [num_draft]: each draft node's path probability, the product of the drafter's
    probabilities along its path from the root (nodes in the tree's order)."""
    return batch_path_probs([tree])[0]


def batch_path_probs(trees: list[DraftTree]) -> tuple[np.ndarray, np.ndarray]:
    """(float64 [total draft nodes] path probabilities of every tree's draft nodes, int64 [T+1]
    offsets of each tree's nodes in it), for the whole step at once: one segmented cumulative sum
    when every tree is a chain, else one vectorised pass per tree level."""
    sizes = np.fromiter((t.num_draft for t in trees), dtype=np.int64, count=len(trees))
    offsets = np.zeros(len(trees) + 1, dtype=np.int64)
    np.cumsum(sizes, out=offsets[1:])
    if not offsets[-1]:
        return np.zeros(0), offsets
    lp = np.concatenate([np.asarray(t.logprob[1:], dtype=np.float64) for t in trees])
    parents = np.concatenate([np.asarray(t.parents[1:], dtype=np.int64) for t in trees])  # local, 0 = root
    local = local_index(sizes)
    starts = np.repeat(offsets[:-1], sizes)
    if np.array_equal(parents, local):           # chains: each node's parent is the node before it
        total = np.cumsum(lp)
        before = np.concatenate([[0.0], total])[starts]
        return np.exp(total - before), offsets
    depth = np.concatenate([np.asarray(t.depth[1:], dtype=np.int64) for t in trees])
    path = np.zeros(lp.size + 1)                 # the last entry stays 0: every root's path
    parent = np.where(parents > 0, starts + parents - 1, lp.size)
    for d in range(1, int(depth.max()) + 1):     # parents are one level up, already summed
        at = depth == d
        path[:-1][at] = path[parent[at]] + lp[at]
    return np.exp(path[:-1]), offsets


def batch_sources(trees: list[DraftTree]) -> np.ndarray:
    """int8 [total draft nodes]: each draft node's source (DraftTree.source; 0 for trees without),
    in the order of `batch_path_probs`."""
    parts = [t.source[1:] if t.source is not None else np.zeros(t.num_draft, dtype=np.int8) for t in trees]
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int8)


def keep_prefixes(worth: np.ndarray, offsets: np.ndarray, row_cost: float) -> tuple[np.ndarray, np.ndarray]:
    """Per tree (nodes `worth[offsets[t]:offsets[t+1]]`): (int64 nodes kept, float their net
    gain in tokens). Kept = the longest prefix (in the tree's order, so the kept nodes are a tree)
    whose every node is worth at least `row_cost` tokens."""
    sizes = np.diff(offsets)
    if worth.size == 0:
        return np.zeros(sizes.size, dtype=np.int64), np.zeros(sizes.size)
    starts = offsets[:-1]
    first_below = np.where(worth < row_cost, local_index(sizes), np.repeat(sizes, sizes))
    nonempty = sizes > 0
    kept = np.zeros(sizes.size, dtype=np.int64)
    kept[nonempty] = np.minimum.reduceat(first_below, starts[nonempty])
    running = np.concatenate([[0.0], np.cumsum(worth)])
    net = running[starts + kept] - running[starts] - kept * row_cost
    return kept, net


class DraftCalibration:
    """Acceptance of drafted nodes by the drafter's path probability, per class and node source
    (DraftTree.source: one curve each; source 0 is also every node of a tree without sources).

    `bins`: equal-width path-probability bins over [0, 1]; `prior_weight`: pseudo-nodes per bin
    at the bin's centre rate (its prior); `window`: counts are halved when a bin has seen this
    many nodes, so the rates follow the traffic (the last few thousand nodes of each bin)."""

    def __init__(self, bins: int = 20, prior_weight: float = 4.0, window: float = 2048.0) -> None:
        if bins < 1 or prior_weight <= 0 or window <= prior_weight:
            raise ValueError("need bins >= 1, prior_weight > 0, window > prior_weight")
        self.bins = int(bins)
        self.prior_weight, self.window = float(prior_weight), float(window)
        self._prior = (np.arange(self.bins) + 0.5) / self.bins
        self._counts: dict[str, tuple[np.ndarray, np.ndarray]] = {}   # class -> (verified, accepted)
        self._rates: dict[str, np.ndarray] = {}                        # class -> rates, until observed

    def _bin(self, probs: np.ndarray) -> np.ndarray:
        return np.clip((np.asarray(probs, dtype=np.float64) * self.bins).astype(np.int64), 0, self.bins - 1)

    @staticmethod
    def _key(cls: str, source: int) -> str:
        return cls if source == 0 else f"{cls}/source{source}"

    def rates(self, cls: str, source: int = 0) -> np.ndarray:
        """float [bins]: each bin's acceptance rate for the class and node source, non-decreasing
        in the bin (computed once per curve after each `observe`)."""
        key = self._key(cls, int(source))
        rates = self._rates.get(key)
        if rates is None:
            counts = self._counts.get(key)
            if counts is None:
                return self._prior
            verified, accepted = counts
            w = self.prior_weight
            rates = self._rates[key] = _monotone((accepted + w * self._prior) / (verified + w), verified + w)
        return rates

    def worth(self, cls: str, probs: np.ndarray, sources: np.ndarray | None = None) -> np.ndarray:
        """float [n]: expected acceptance of nodes rated `probs` (path probabilities), from the
        sources' curves (`sources`: int [n], DraftTree.source; None: all 0)."""
        b = self._bin(probs)
        if sources is None or not np.any(sources):
            return self.rates(cls)[b]
        sources = np.asarray(sources)
        out = np.empty(b.size)
        for src in np.unique(sources).tolist():
            at = sources == src
            out[at] = self.rates(cls, src)[b[at]]
        return out

    def observe(self, cls: str, probs: np.ndarray, accepted: np.ndarray,
                sources: np.ndarray | None = None) -> None:
        """Verified nodes: their path probabilities, whether each was accepted and (optional)
        their sources."""
        if len(probs) == 0:
            return
        if sources is not None and np.any(sources):
            sources, probs, accepted = np.asarray(sources), np.asarray(probs), np.asarray(accepted)
            for src in np.unique(sources).tolist():
                at = sources == src
                self._observe(self._key(cls, src), probs[at], accepted[at])
        else:
            self._observe(self._key(cls, 0), probs, accepted)

    def _observe(self, key: str, probs: np.ndarray, accepted: np.ndarray) -> None:
        counts = self._counts.get(key)
        if counts is None:
            counts = self._counts[key] = (np.zeros(self.bins), np.zeros(self.bins))
        self._rates.pop(key, None)
        verified, acc = counts
        b = self._bin(probs)
        np.add.at(verified, b, 1.0)
        np.add.at(acc, b, np.asarray(accepted, dtype=np.float64))
        full = verified >= self.window
        if full.any():
            verified[full] *= 0.5
            acc[full] *= 0.5

    def observed(self, cls: str, source: int = 0) -> np.ndarray:
        """float [bins]: the curve's (decayed) verified-node counts (zeros before any)."""
        counts = self._counts.get(self._key(cls, int(source)))
        return counts[0].copy() if counts is not None else np.zeros(self.bins)


def _monotone(rates: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """The non-decreasing sequence closest to `rates` in weighted least squares (pool adjacent
    violators): a bin seen rarely (its prior's weight only) that breaks the order is pooled with
    its well-measured neighbour and takes little of its value, instead of lifting it."""
    blocks: list[list[float]] = []             # [weighted sum, weight, bins]
    for r, w in zip(rates.tolist(), weights.tolist()):
        blocks.append([r * w, w, 1])
        while len(blocks) > 1 and blocks[-2][0] / blocks[-2][1] > blocks[-1][0] / blocks[-1][1]:
            s, w2, n = blocks.pop()
            blocks[-1][0] += s
            blocks[-1][1] += w2
            blocks[-1][2] += n
    return np.repeat([b[0] / b[1] for b in blocks], [b[2] for b in blocks])
