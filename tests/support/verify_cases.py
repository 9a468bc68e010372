"""Slow pure-Python references and statistics used to test the acceptance rules.

Kept next to the rules so every test module (and the acceptance simulator) checks against the
same definitions: random tree batches, a brute-force greedy path, the exact law of the tokens one
verification step emits, and a chi-square goodness-of-fit p-value (torch only, no scipy).
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from vllm_treespec.tree import TreeBatch


def distinct_sibling_trees(rng: np.random.Generator, num_requests: int, vocab: int,
                           max_size: int = 11) -> TreeBatch:
    """A TreeBatch of random trees of 1..max_size nodes whose siblings carry
    distinct tokens (what a drafter proposes), root token 0."""
    offsets, tokens, parents = [0], [], []
    for _ in range(num_requests):
        size = int(rng.integers(1, max_size + 1))
        tokens.append(0)
        parents.append(-1)
        for i in range(1, size):
            parent = int(rng.integers(0, i))
            siblings = {tokens[offsets[-1] + j] for j in range(1, i)
                        if parents[offsets[-1] + j] == parent}
            tokens.append(int(rng.choice([t for t in range(vocab) if t not in siblings])))
            parents.append(parent)
        offsets.append(offsets[-1] + size)
    return TreeBatch.from_arrays(offsets, tokens, parents)


def random_tree_batch(
    rng: np.random.Generator,
    sizes: Sequence[int],
    vocab: int,
    max_children: int | None = None,
) -> TreeBatch:
    """Random flat tree batch: request b has ``sizes[b]`` rows, parents drawn among earlier nodes,
    distinct sibling tokens (needs vocab >= the widest fan-out)."""
    tokens: list[int] = []
    parents: list[int] = []
    offsets = [0]
    for n in sizes:
        kids: dict[int, set[int]] = {}
        tokens.append(int(rng.integers(vocab)))
        parents.append(-1)
        for i in range(1, n):
            while True:
                par = int(rng.integers(i))
                used = kids.setdefault(par, set())
                limit = vocab if max_children is None else min(vocab, max_children)
                if len(used) < limit:
                    break
            free = [t for t in range(vocab) if t not in used]
            tok = int(free[int(rng.integers(len(free)))])
            used.add(tok)
            tokens.append(tok)
            parents.append(par)
        offsets.append(offsets[-1] + n)
    return TreeBatch.from_arrays(offsets, tokens, parents)


def biased_logits(rng: np.random.Generator, tree: TreeBatch, vocab: int,
                  follow: float, boost: float) -> torch.Tensor:
    """float32 [nodes, vocab] standard-normal logits of a `random_tree_batch` tree where, with
    probability `follow`, a node's row gets `boost` added at one of its children's tokens, so
    greedy paths get long."""
    tokens, parents, offsets = (getattr(tree, k).tolist() for k in ("tokens", "parents", "offsets"))
    logits = torch.from_numpy(rng.standard_normal((len(tokens), vocab)).astype(np.float32))
    for b in range(len(offsets) - 1):
        lo, hi = offsets[b], offsets[b + 1]
        kids: dict[int, list[int]] = {}
        for i in range(lo + 1, hi):
            kids.setdefault(lo + parents[i], []).append(tokens[i])
        for row, toks in kids.items():
            if rng.random() < follow:
                logits[row, toks[int(rng.integers(len(toks)))]] += boost
    return logits


def _children(parents: Sequence[int]) -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for i, par in enumerate(parents):
        if par >= 0:
            kids.setdefault(par, []).append(i)
    return kids


def greedy_reference(
    tokens: Sequence[int], parents: Sequence[int], logits: torch.Tensor
) -> tuple[list[int], list[int]]:
    """Brute force for one request: enumerate every root-to-node path, keep the longest one whose
    every token is the argmax of its parent's row; return (emitted tokens, accepted nodes)."""
    argmax = [int(r) for r in logits.to(torch.float32).argmax(dim=1)]
    best: list[int] = []
    for node in range(len(tokens)):
        path = []
        u = node
        while u > 0:
            path.append(u)
            u = parents[u]
        path.reverse()
        ok = all(tokens[v] == argmax[parents[v]] for v in path)
        if ok and len(path) > len(best):
            best = path
    last = best[-1] if best else 0
    return [tokens[v] for v in best] + [argmax[last]], best


def emitted_distribution(
    tokens: Sequence[int], parents: Sequence[int], probs: np.ndarray
) -> dict[tuple[int, ...], float]:
    """Exact law of the token sequence one step emits when each node's next token is drawn from
    its row of ``probs`` [N, V] and the walk descends while the token is a child: the product of
    the row probabilities along the sequence (autoregressive sampling from the target)."""
    kids = _children(parents)
    out: dict[tuple[int, ...], float] = {}

    def walk(node: int, prefix: tuple[int, ...], mass: float) -> None:
        by_token = {tokens[c]: c for c in kids.get(node, [])}
        for tok, pr in enumerate(probs[node]):
            if pr <= 0:
                continue
            if tok in by_token:
                walk(by_token[tok], prefix + (tok,), mass * float(pr))
            else:
                out[prefix + (tok,)] = mass * float(pr)

    walk(0, (), 1.0)
    return out


def encode_rows(emitted: np.ndarray, vocab: int) -> np.ndarray:
    """Integer code per row of a -1-padded token matrix (base vocab+1, padding = 0)."""
    code = np.zeros(emitted.shape[0], dtype=np.int64)
    for j in range(emitted.shape[1]):
        code = code * (vocab + 1) + (emitted[:, j] + 1)
    return code


def encode_sequence(seq: Sequence[int], width: int, vocab: int) -> int:
    row = np.full((1, width), -1, dtype=np.int64)
    row[0, : len(seq)] = seq
    return int(encode_rows(row, vocab)[0])


def chi_square_pvalue(
    observed: Mapping[int, int], expected: Mapping[int, float], min_expected: float = 5.0
) -> tuple[float, int, float]:
    """Pearson goodness-of-fit of outcome counts against exact probabilities.

    Cells with expected count < ``min_expected`` are pooled into one cell. An outcome that has
    probability 0 but was observed gives p = 0 outright. Returns (statistic, dof, p-value).
    """
    n = sum(observed.values())
    if any(expected.get(k, 0.0) <= 0 and c > 0 for k, c in observed.items()):
        return float("inf"), 0, 0.0
    keys = [k for k, pr in expected.items() if pr > 0]
    exp = np.array([expected[k] * n for k in keys])
    obs = np.array([observed.get(k, 0) for k in keys], dtype=np.float64)
    small = exp < min_expected
    cells_e = list(exp[~small])
    cells_o = list(obs[~small])
    if small.any():
        if exp[small].sum() >= min_expected or not cells_e:
            cells_e.append(exp[small].sum())
            cells_o.append(obs[small].sum())
        else:  # still too small on its own: fold into the smallest regular cell
            j = int(np.argmin(cells_e))
            cells_e[j] += exp[small].sum()
            cells_o[j] += obs[small].sum()
    cells_e_arr, cells_o_arr = np.array(cells_e), np.array(cells_o)
    stat = float(((cells_o_arr - cells_e_arr) ** 2 / cells_e_arr).sum())
    dof = len(cells_e) - 1
    if dof <= 0:
        return stat, dof, 1.0
    p = torch.special.gammaincc(
        torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
    )
    return stat, dof, float(p)
