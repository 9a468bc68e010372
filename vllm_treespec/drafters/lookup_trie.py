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
token buffer directly, batched, without the GIL; tests/support/lookup_trie_reference.py has the
same semantics in plain Python, the tests' oracle.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from vllm_treespec.drafters.base import DraftInputs, Drafter, DrafterCapabilities, Proposal, split_flat_trees
from vllm_treespec.drafters.ngram_trie import load_checked_trie
from vllm_treespec.tree import DraftTree

__all__ = ["LookupTrieDrafter", "native_trees"]


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

