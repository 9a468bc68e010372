"""Lookup-trie drafter: prompt lookup where the request repeats itself, a corpus n-gram trie
everywhere else, mixed in one best-first tree.

Prompt lookup alone drafts nothing on steps whose suffix never occurred before (on the code-LM
fixture 23-26% of the steps, benchmarks/results/replay_tau_code-lm.json) and its trees hedge
only between earlier matches; the trie alone always has a guess but sees two tokens of context.
Per node the children's probabilities are the mixture
P(c) = lambda * q_lookup(c) + (1 - lambda) * q_trie(c) (lambda = `lookup_weight` where the path
still follows a match continuation, else 0), and the tree is the `budget` best paths by the
product of P (lazy best-first; the exact rule is in csrc/lookup/lookup_trie_tree.h), cut
where that product falls below `min_path_prob`.
tree.builder chain drafts the greedy spine of the same mixture. The C++ core reads the engine's
token buffer directly, batched, without the GIL;
`lookup_trie_trees_reference` is the same semantics in plain Python, for tests.
"""
from __future__ import annotations

import heapq
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vllm_treespec.drafters.base import DraftInputs, Drafter, DrafterCapabilities, Proposal, split_flat_trees
from vllm_treespec.drafters.ngram_trie import load_checked_trie
from vllm_treespec.tree import DraftTree

__all__ = ["LookupTrieDrafter", "lookup_trie_trees_reference", "native_trees"]


def native_trees(trie: Any, inputs: DraftInputs, **params: Any) -> list[DraftTree]:
    """One C++ call (csrc/lookup/lookup_trie_tree.h) for every request of the step."""
    if len(inputs) == 0:
        return []
    return split_flat_trees(*trie._t.lookup_trie_trees(
        inputs.token_ids, np.asarray(inputs.rows, dtype=np.int64),
        np.asarray(inputs.num_tokens, dtype=np.int64), np.asarray(inputs.budgets, dtype=np.int64),
        **params))


class LookupTrieDrafter(Drafter):
    name = "lookup_trie"

    def __init__(self, config: Any, tokenizer_dir: str | Path | None, tree: Any = None) -> None:
        self.trie = load_checked_trie(config.path, tokenizer_dir, config.order)
        self.chain = tree is None or tree.builder == "chain"
        self.max_depth = (tree.max_depth if tree is not None else None) or 8
        self.params = dict(min_ngram=int(config.min_ngram), max_ngram=int(config.max_ngram),
                           max_matches=int(config.max_matches), max_depth=int(self.max_depth),
                           k=int(config.k), min_context=int(config.min_context),
                           lookup_weight=float(config.lookup_weight),
                           min_path_prob=float(config.min_path_prob))
        self.online = bool(config.online_mb)
        if self.online:
            self.trie.enable_online(capacity_mb=float(config.online_mb))
        self.capabilities = DrafterCapabilities(observes_output=self.online)

    def propose(self, inputs: DraftInputs) -> Proposal:
        params = {**self.params, "max_depth": inputs.max_depth(self.max_depth)}   # a table rule's depth
        return Proposal(native_trees(self.trie, inputs, chain=self.chain, **params))

    def observe_output(self, tokens: np.ndarray) -> None:
        """Learn a finished request's output in the trie's online layer (drafter.online_mb)."""
        if len(tokens) > 0:
            self.trie.observe(tokens)


# ---------------------------------------------------------------------------- reference
def lookup_trie_trees_reference(token_ids: np.ndarray, rows: Sequence[int], num_tokens: Sequence[int],
                                budgets: Sequence[int], trie: Any, *, min_ngram: int, max_ngram: int,
                                max_matches: int, max_depth: int, k: int, min_context: int,
                                lookup_weight: float, chain: bool,
                                min_path_prob: float = 0.0) -> list[DraftTree]:
    """Plain-Python `LookupTrieDrafter.propose` (full push instead of lazy push: the same pop
    order, since log P <= 0), over the Python trie API; the tests' oracle."""
    from vllm_treespec.native import native

    m = max(1, trie.order - 1)
    floor = math.log(min_path_prob) if min_path_prob > 0 else -math.inf
    out = []
    for r, n, budget in zip(np.asarray(rows).tolist(), np.asarray(num_tokens).tolist(),
                            np.asarray(budgets).tolist()):
        tokens = [int(t) for t in token_ids[r, :n]]
        root = tokens[-1]
        # the merged match continuations, node weights included (weights = matches through)
        mt, mp, _, mw, *_ = native().propose_tree_batch(
            token_ids, np.array([r]), np.array([n]), np.array([1 << 20]), min_ngram, max_ngram,
            max(max_matches, 1), max_depth, 1.0)
        kids: dict[int, dict[int, int]] = {}
        if max_matches > 0:
            for j in range(1, len(mt)):
                kids.setdefault(int(mp[j]), {})[int(mt[j])] = j
        toks, pars, deps, lps, scs = [root], [-1], [0], [0.0], [0.0]
        if budget <= 0:
            out.append(DraftTree(toks, pars, deps, lps, scs))
            continue

        def children(path: tuple, match: int | None) -> list:
            if len(path) >= max_depth:
                return []
            lk = kids.get(match, {}) if match is not None else {}
            lam = lookup_weight if lk else 0.0
            probs: dict[int, float] = {}
            for t, c in lk.items():
                probs[t] = 0.0 + lam * (float(mw[c]) / float(mw[match]))
            ctx = (tokens + list(path))[-m:]
            tt, pp, _ = trie.topk_batch([ctx], k)
            _, orders = trie.prob_batch([ctx], tt.clip(min=0), return_orders=True)
            for j in range(k):
                t = int(tt[0, j])
                if t < 0:
                    break
                if min_context > 0 and orders[0, j] < min_context:
                    continue
                probs[t] = probs.get(t, 0.0) + (1.0 - lam) * float(pp[0, j])
            ranked = sorted(((p, t) for t, p in probs.items() if p > 0), key=lambda x: (-x[0], x[1]))
            return [(t, p, lk.get(t)) for p, t in ranked]

        root_match = 0 if (max_matches > 0 and len(mt) > 1) else None
        if chain:
            path, match, score, parent = (), root_match, 0.0, 0
            while len(toks) - 1 < budget:
                ch = children(path, match)
                if not ch:
                    break
                t, p, match = ch[0]
                lp = math.log(p)
                if score + lp < floor:
                    break
                score += lp
                toks.append(t), pars.append(parent), deps.append(len(path) + 1), lps.append(lp), scs.append(score)
                parent, path = len(toks) - 1, path + (t,)
            out.append(DraftTree(toks, pars, deps, lps, scs))
            continue
        heap: list = []

        def push_children(path: tuple, match: int | None, score: float, out_index: int, pospath: tuple) -> None:
            for i, (t, p, cm) in enumerate(children(path, match)):
                lp = math.log(p)
                heapq.heappush(heap, (-(score + lp), len(path) + 1, pospath + (i,), path + (t,), cm,
                                      out_index, lp))

        push_children((), root_match, 0.0, 0, ())
        while heap and len(toks) - 1 < budget and -heap[0][0] >= floor:
            neg, d, pospath, path, cm, parent, lp = heapq.heappop(heap)
            toks.append(path[-1]), pars.append(parent), deps.append(d), lps.append(lp), scs.append(-neg)
            push_children(path, cm, -neg, len(toks) - 1, pospath)
        out.append(DraftTree(toks, pars, deps, lps, scs))
    return out
