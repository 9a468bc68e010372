"""N-gram trie drafter: draft from a corpus-wide n-gram trie (DART's continuity signal, used alone).

The trie (vllm_treespec.ngram) is memory-mapped, so every vLLM worker shares one copy. Its token
ids are only meaningful under the tokenizer it was built with, so loading checks the trie's
tokenizer fingerprint against the served model's tokenizer and fails startup on a mismatch.

Three ways to draft from it:
- tree.builder chain and tree.builder best_first with the acc_logp scorer: the C++ core of the
  lookup-trie drafter with prompt lookup switched off (csrc/lookup/lookup_trie_tree.h), batched
  over the engine's token buffer without the GIL (the per-request Python Expander cost 0.6-3.5 ms
  per step, the depth-by-depth Python chain loop up to 1 ms at 64 tokens). The chain is the
  greedy spine with one candidate per node (k = 1), i.e. exactly `propose_chains`, which stays
  as its plain-Python reference;
- any other builder or scorer: per request, an `Expander` (top-k continuations of each path)
  shaped by that builder of `vllm_treespec.tree`; scorers that need rho (dart, presto) get the
  trie as rho.
Children per node: tree.topk when set, else drafter.k (never more than drafter.k).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vllm_treespec.drafters.base import DraftInputs, Drafter, DrafterCapabilities, Proposal
from vllm_treespec.schema import ConfigError
from vllm_treespec.tree import DraftTree, build_tree


def load_checked_trie(path_spec: str, tokenizer_dir: str | Path | None, expected_order: int | None,
                      key: str = "drafter.path") -> Any:
    """Resolve `path_spec` (a file, or a prefixed path such as the lab's `fixture:NAME`: see
    vllm_treespec/paths.py), load it and check tokenizer and order."""
    from vllm_treespec.ngram import NgramTrie, TrieFormatError, tokenizer_fingerprint
    from vllm_treespec.paths import resolve_path

    try:
        path = resolve_path(path_spec, "trie", tokenizer_dir)
    except ValueError as e:
        raise ConfigError(f"{key}: {e}") from None
    if not path.is_file():
        raise ConfigError(f"{key}: trie file {path} does not exist; build one with "
                          "`vllm-treespec ngram build --tokenizer MODEL_DIR --out FILE INPUT...` "
                          "or `vllm-treespec train trie MODEL_DIR --out FILE`")
    fingerprint = tokenizer_fingerprint(tokenizer_dir) if tokenizer_dir is not None else None
    try:
        trie = NgramTrie.load(path, expected_fingerprint=fingerprint)
    except TrieFormatError as e:
        raise ConfigError(f"{key}: {e}") from None
    if expected_order is not None and trie.order != expected_order:
        raise ConfigError(f"drafter.order: {expected_order} does not match the trie {path}, which has "
                          f"order {trie.order}; set order: {trie.order} (or null) or build a new trie")
    return trie


class TrieSignal:
    """The trie as a tree-scoring signal rho (PRESTO prefix-aligned scoring, DART COMBINE).

    Implements `vllm_treespec.tree.NgramSignal`: log P(candidate | context) with the trie's
    longest-suffix backoff; candidates no suffix has seen get `floor` (log of it), so a builder's
    scores stay finite (DART smooths its logs with a small epsilon the same way).
    """

    def __init__(self, trie: Any, floor: float = 1e-10) -> None:
        self.trie, self.floor = trie, float(floor)
        self.context_len = max(1, trie.order - 1)

    def logprobs(self, context: Sequence[int], candidates: np.ndarray) -> np.ndarray:
        ctx = [int(t) for t in context][-self.context_len:]
        probs = self.trie.prob(ctx, np.asarray(candidates, dtype=np.int32), floor=self.floor)
        # the C library's log, as the C++ scorer uses (numpy's SIMD log differs in the last bit)
        return np.array([math.log(p) if p > 0 else -math.inf for p in probs.tolist()], dtype=np.float64)

    def native(self) -> Any:
        """The C++ twin the C++ tree builders score with (`NgramTrie.scorer`): same backoff and
        floor, with the C library's log. Made per call, so it sees the trie's current online layer."""
        return self.trie.scorer(self.floor)


class NgramTrieDrafter(Drafter):
    name = "ngram_trie"

    def __init__(self, config: Any, tokenizer_dir: str | Path | None, tree: Any = None) -> None:
        self.trie = load_checked_trie(config.path, tokenizer_dir, config.order)
        self.tree_builder = tree.builder if tree is not None else "chain"
        self.builder_params = tree.builder_params() if tree is not None else {}
        self.rho = TrieSignal(self.trie) if tree is not None and tree.scorer != "acc_logp" else None
        self.k = int(config.k)
        chain = self.tree_builder == "chain"
        self.native = chain or (self.tree_builder == "best_first" and tree.scorer == "acc_logp"
                                and not self.builder_params.get("scorer_params"))
        self.min_context = int(config.min_context)
        self.native_params = self._native_params(self.builder_params)
        self.context_len = max(1, self.trie.order - 1)
        self.online = bool(config.online_mb)
        if self.online:
            self.trie.enable_online(capacity_mb=float(config.online_mb))
        self.capabilities = DrafterCapabilities(observes_output=self.online)

    def _native_params(self, builder_params: dict[str, Any]) -> dict[str, Any]:
        """The C++ core's arguments for these tree keys (max_depth; topk caps the children k)."""
        chain = self.tree_builder == "chain"
        topk = builder_params.get("topk")
        depth = builder_params.get("max_depth") or (1 << 20 if chain else 8)
        return dict(min_ngram=1, max_ngram=1, max_matches=0, max_depth=int(depth),
                    k=1 if chain else (min(self.k, int(topk)) if topk else self.k),
                    min_context=self.min_context, lookup_weight=0.0, chain=chain)

    def _contexts(self, inputs: DraftInputs, idx: np.ndarray) -> list[np.ndarray]:
        rows, ends = inputs.rows[idx], inputs.num_tokens[idx]
        return [inputs.token_ids[r, max(0, e - self.context_len): e] for r, e in zip(rows.tolist(), ends.tolist())]

    def propose(self, inputs: DraftInputs) -> Proposal:
        if self.native:
            return Proposal(self.propose_native(inputs))
        params = inputs.tree_params(self.builder_params)
        trees = []
        for i in range(len(inputs)):
            root = inputs.root(i)
            budget = int(inputs.budgets[i])
            if budget <= 0:
                trees.append(DraftTree.root_only(root))
                continue
            context = inputs.context(i, self.context_len + 1)[:-1]
            trees.append(build_tree(self.tree_builder, self.expander(context, root), budget, **params))
        return Proposal(trees)

    def propose_native(self, inputs: DraftInputs) -> list[DraftTree]:
        """Chains or best-first trees of all requests in one C++ call (max_matches 0: the trie
        alone)."""
        from vllm_treespec.drafters.lookup_trie import native_trees

        params = (self._native_params(inputs.tree_params(self.builder_params)) if inputs.tree_overrides
                  else self.native_params)
        return native_trees(self.trie, inputs, **params)

    def propose_chains(self, inputs: DraftInputs) -> list[list[int]]:
        """Greedy chains: the trie's most likely next token, depth by depth, for all requests
        (reference of the native chain: stops where the top token's context is too short)."""
        out: list[list[int]] = [[] for _ in range(len(inputs))]
        budgets = np.minimum(inputs.budgets, inputs.max_depth(self.builder_params.get("max_depth", 1 << 20)))
        active = np.nonzero(budgets > 0)[0]
        if active.size == 0:
            return out
        cursors = self.trie.cursors(self._contexts(inputs, active))
        budgets = budgets[active]
        live = np.arange(active.size)
        for depth in range(int(budgets.max())):
            live = live[budgets[live] > depth]
            if live.size == 0:
                break
            toks, _, found = self.trie.topk_cursors(cursors[live], 1)
            hit = found > 0
            if self.min_context > 0 and hit.any():
                _, orders = self.trie.prob_cursors(cursors[live], toks[:, :1].clip(min=0), return_orders=True)
                hit &= orders[:, 0] >= self.min_context
            live = live[hit]
            if live.size == 0:
                break
            tokens = toks[hit, 0]
            for j, t in zip(live.tolist(), tokens.tolist()):
                out[int(active[j])].append(int(t))
            cursors[live] = self.trie.advance(cursors[live], tokens)
        return out

    def expander(self, context: Sequence[int], root: int) -> Any:
        """A tree Expander for one request: children of a path = the trie's top-k continuations."""
        from vllm_treespec.tree import Expander

        base = [int(t) for t in context][-self.context_len:] + [int(root)]

        def expand(paths: list[tuple[int, ...]], k: int) -> tuple[np.ndarray, np.ndarray]:
            ctxs = [(base + list(p))[-self.context_len:] for p in paths]
            toks, probs, _ = self.trie.topk_batch(ctxs, k)
            if k > self.k:     # drafter.k caps the children per node: the rest are absent
                toks[:, self.k:], probs[:, self.k:] = -1, 0.0
            if self.min_context > 0:
                _, orders = self.trie.prob_batch(ctxs, toks.clip(min=0), return_orders=True)
                toks = np.where(orders >= self.min_context, toks, -1)
            with np.errstate(divide="ignore"):
                logp = np.where(toks >= 0, np.log(np.maximum(probs, 1e-300)), -np.inf)
            return toks.astype(np.int64), logp

        return Expander(expand, root=int(root), context=tuple(int(t) for t in context), rho=self.rho)

    def observe_output(self, tokens: np.ndarray) -> None:
        """Learn a finished request's output in the online layer (drafter.online_mb)."""
        if len(tokens) > 0:
            self.trie.observe(tokens)
