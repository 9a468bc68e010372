"""Prompt-lookup drafter: continue the longest earlier occurrence of the request's own suffix.

tree.builder chain drafts the best match's continuation; best_first merges the continuations of
up to `max_matches` earlier matches into one tree (nodes ranked by how many matches continue
through them, see drafters/lookup_tree.py). Stateless per request (the match is recomputed from the token buffer each step, O(context) in
C++ without the GIL), so there is nothing to resync after preemption or to free on finish.
"""
from __future__ import annotations

from typing import Any

import numpy as np

from vllm_treespec.drafters.base import DraftInputs, Drafter, Proposal, chain_trees
from vllm_treespec.native import native


class PromptLookupDrafter(Drafter):
    name = "prompt_lookup"

    def __init__(self, config: Any, tree: Any = None) -> None:
        self.min_ngram = int(config.min_ngram)
        self.max_ngram = int(config.max_ngram)
        self.max_matches = int(config.max_matches)
        self.continue_prob = float(config.continue_prob)
        self.tree_builder = tree.builder if tree is not None else "chain"
        self.max_depth = (tree.max_depth if tree is not None else None) or 1 << 20
        self._C = native()

    def propose(self, inputs: DraftInputs) -> Proposal:
        if self.tree_builder == "best_first":
            from vllm_treespec.drafters.lookup_tree import lookup_trees

            return Proposal(lookup_trees(inputs.token_ids, inputs.rows, inputs.num_tokens, inputs.budgets,
                                min_ngram=self.min_ngram, max_ngram=self.max_ngram,
                                max_matches=self.max_matches, max_depth=inputs.max_depth(self.max_depth),
                                continue_prob=self.continue_prob))
        return Proposal(chain_trees(inputs, self.propose_chains(inputs)))

    def propose_chains(self, inputs: DraftInputs) -> list[list[int]]:
        """The best match's continuation per request (at most budgets[i] and max_depth tokens)."""
        out: list[list[int]] = [[] for _ in range(len(inputs))]
        budgets = np.minimum(inputs.budgets, inputs.max_depth(self.max_depth))
        active = np.nonzero(budgets > 0)[0]
        if active.size == 0:
            return out
        k = int(budgets[active].max())
        drafts, counts = self._C.propose_chain_batch(
            inputs.token_ids, inputs.rows[active], inputs.num_tokens[active], budgets[active],
            self.min_ngram, self.max_ngram, k)
        for j, i in enumerate(active.tolist()):
            n = int(counts[j])
            if n:
                out[i] = drafts[j, :n].tolist()
        return out
