"""`lookup_trie_trees_reference`: the lookup-trie drafter's trees (drafters/lookup_trie.py, C++ core
csrc/lookup/lookup_trie_tree.h) in plain Python over the Python trie API, the tests' oracle.
"""
from __future__ import annotations

import heapq
import math
from typing import Any, Sequence

import numpy as np

from vllm_treespec.tree import DraftTree

__all__ = ["SOURCE_MATCH", "SOURCE_TRIE", "lookup_trie_trees_reference", "match_trie_reference"]

SOURCE_MATCH, SOURCE_TRIE = 0, 1     # DraftTree.source: a match continuation, the trie's guess alone


def _own_matches(tokens: list[int], min_n: int, max_n: int, k: int) -> list[tuple]:
    """Earlier occurrences of the suffix in the request's own text (prompt_lookup.h):
    (match_len, continuation_len, start, source) with at least one continuation token."""
    n, out = len(tokens), []
    for j in range(n - 2, -1, -1):
        length = 0
        while length < min(max_n, j + 1) and tokens[j - length] == tokens[n - 1 - length]:
            length += 1
        if length >= min_n:
            out.append((length, min(k, n - (j + 1)), j + 1, "own"))
    return out


def _recent_matches(tokens: list[int], outputs: Sequence[Sequence[int]], min_n: int, max_n: int,
                    k: int, anchor: int = 2) -> list[tuple]:
    """Occurrences of the suffix inside one recent output (recent_outputs.h): at least
    max(min_n, anchor) tokens, start = position in the store (outputs joined, one separator
    after each), so a later output is more recent."""
    n, out, offset = len(tokens), [], 0
    for o in outputs:
        o = list(o)
        for start in range(1, len(o)):          # continuation starts here: needs o[start]
            length = 0
            while length < min(max_n, n, start) and o[start - 1 - length] == tokens[n - 1 - length]:
                length += 1
            if length >= max(min_n, anchor):
                cont = 0
                while cont < k and start + cont < len(o):
                    cont += 1
                out.append((length, cont, offset + start, "recent"))
        offset += len(o) + 1
    return out


def match_trie_reference(tokens: list[int], *, min_ngram: int, max_ngram: int, max_matches: int,
                         max_depth: int, recent: Sequence[Sequence[int]] = (),
                         recent_max_ngram: int = 0) -> tuple[dict, dict, int]:
    """The merged match continuations (lookup_tree.h build_match_trie) as (kids, weights, length):
    kids[node] = {token: child}, weights[node] = matches through it (node 0 is the root), length
    = the merged matches' suffix length (0: none)."""
    kids: dict[int, dict[int, int]] = {}
    weights = {0: 0}
    if max_matches < 1 or max_depth < 1:
        return kids, weights, 0
    rank = lambda m: (-m[0], -m[1], -m[2])   # longer match, longer continuation, more recent
    own = sorted(_own_matches(tokens, min_ngram, max_ngram, max_depth), key=rank)[:max_matches]
    others = []
    if recent_max_ngram > 0:
        others = sorted(_recent_matches(tokens, recent, min_ngram, recent_max_ngram, max_depth),
                        key=rank)[:max_matches]
    if not own and not others:
        return kids, weights, 0
    best = max(m[0] for m in own + others)
    chosen = ([m for m in own if m[0] == best] + [m for m in others if m[0] == best])[:max_matches]
    store = [t for o in recent for t in list(o) + [-1]]
    for length, cont, start, source in chosen:
        seq = (tokens if source == "own" else store)[start:start + cont]
        node = 0
        weights[0] += 1
        for t in seq:
            child = kids.setdefault(node, {}).get(t)
            if child is None:
                child = len(weights)
                kids[node][t] = child
                weights[child] = 0
            weights[child] += 1
            node = child
    return kids, weights, best


def lookup_trie_trees_reference(token_ids: np.ndarray, rows: Sequence[int], num_tokens: Sequence[int],
                                budgets: Sequence[int], trie: Any, *, min_ngram: int, max_ngram: int,
                                max_matches: int, max_depth: int, k: int, min_context: int,
                                lookup_weight: float, chain: bool,
                                min_path_prob: float = 0.0, recent: Sequence[Sequence[int]] = (),
                                recent_max_ngram: int = 0, depth_per_match: float = 0.0) -> list[DraftTree]:
    """Plain-Python `LookupTrieDrafter.propose` (full push instead of lazy push: the same pop
    order, since log P <= 0), over the Python trie API; the tests' oracle. `recent`: the outputs
    the trie observed, oldest first (searched when recent_max_ngram > 0)."""
    m = max(1, trie.order - 1)
    floor = math.log(min_path_prob) if min_path_prob > 0 else -math.inf
    out = []
    for r, n, budget in zip(np.asarray(rows).tolist(), np.asarray(num_tokens).tolist(),
                            np.asarray(budgets).tolist()):
        tokens = [int(t) for t in token_ids[r, :n]]
        root = tokens[-1]
        # the merged match continuations, node weights included (weights = matches through)
        kids, mw, match_len = match_trie_reference(
            tokens, min_ngram=min_ngram, max_ngram=max_ngram, max_matches=max_matches,
            max_depth=max_depth, recent=recent, recent_max_ngram=recent_max_ngram)
        has_matches = mw[0] > 0
        depth_cap = max_depth
        if depth_per_match > 0:
            cap = math.ceil(depth_per_match * (match_len if match_len > 0 else max(1, trie.order - 1)))
            depth_cap = min(max_depth, max(1, cap))
        toks, pars, deps, lps, scs, srcs = [root], [-1], [0], [0.0], [0.0], [0]
        if budget <= 0:
            out.append(DraftTree(toks, pars, deps, lps, scs, source=srcs))
            continue

        def children(path: tuple, match: int | None) -> list:
            if len(path) >= depth_cap:
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

        root_match = 0 if has_matches else None
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
                srcs.append(SOURCE_MATCH if match is not None else SOURCE_TRIE)
                parent, path = len(toks) - 1, path + (t,)
            out.append(DraftTree(toks, pars, deps, lps, scs, source=srcs))
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
            srcs.append(SOURCE_MATCH if cm is not None else SOURCE_TRIE)
            push_children(path, cm, -neg, len(toks) - 1, pospath)
        out.append(DraftTree(toks, pars, deps, lps, scs, source=srcs))
    return out
