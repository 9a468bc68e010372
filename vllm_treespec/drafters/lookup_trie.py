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
tree.builder chain drafts the greedy spine of the same mixture. With `sampled_path`, requests
that sample (temperature > 0) draft from a second trie, one counted from the model's sampled
continuations: a greedy-distilled trie predicts the argmax path, which a sampled request
follows only as often as it samples it. The C++ core reads the engine's
token buffer directly, batched, without the GIL; tests/support/lookup_trie_reference.py has the
same semantics in plain Python, the tests' oracle.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from vllm_treespec.drafters.base import DraftInputs, Drafter, DrafterCapabilities, Proposal, split_flat_trees
from vllm_treespec.drafters.ngram_trie import load_checked_trie
from vllm_treespec.tree import DraftTree
from vllm_treespec.verify.sampling_params import SAMPLING_EPS

__all__ = ["LookupTrieDrafter", "native_trees", "ONLINE_ONLY_ORDER"]

# n-gram order of an online-only trie (drafter.path null) when drafter.order is null: four tokens
# of context, as the distilled tries.
ONLINE_ONLY_ORDER = 5
# memory of the recent outputs per held token (the token, its index entry and hash buckets)
RECENT_BYTES_PER_TOKEN = 32


def native_trees(trie: Any, inputs: DraftInputs, **params: Any) -> list[DraftTree]:
    """One C++ call (csrc/lookup/lookup_trie_tree.h) for every request of the step."""
    if len(inputs) == 0:
        return []
    return split_flat_trees(*trie._t.lookup_trie_trees(
        inputs.token_ids, np.asarray(inputs.rows, dtype=np.int64),
        np.asarray(inputs.num_tokens, dtype=np.int64), np.asarray(inputs.budgets, dtype=np.int64),
        **params))


def _samples(params: Any) -> bool:
    """Whether a request samples (vLLM's rule: temperature >= SAMPLING_EPS, as acceptance
    decides); None (unknown) counts as greedy."""
    return params is not None and float(getattr(params, "temperature", 0.0) or 0.0) >= SAMPLING_EPS


def _subset(inputs: DraftInputs, index: np.ndarray) -> DraftInputs:
    """`inputs` for the requests at `index` (same token buffer)."""
    return replace(inputs, req_ids=[inputs.req_ids[i] for i in index],
                   rows=np.asarray(inputs.rows)[index],
                   num_tokens=np.asarray(inputs.num_tokens)[index],
                   budgets=np.asarray(inputs.budgets)[index],
                   sampling=[inputs.sampling[i] for i in index] if inputs.sampling else None)


class LookupTrieDrafter(Drafter):
    """Per request one of up to four handles on the trie files: the greedy trie (`path`) or the
    sampled one (`sampled_path`), each with this deployment's online layer (drafter.online_mb) or,
    for seeded sampled requests, without it. A seeded request's sampled tokens depend on its tree
    shapes, and the online layer holds other requests' outputs, so it drafts from frozen counts
    and its own text only: it samples the same tokens whatever else the server runs."""
    name = "lookup_trie"

    def __init__(self, config: Any, tokenizer_dir: str | Path | None, tree: Any = None, *,
                 vocab_limit: int | None = None) -> None:
        self.online = bool(config.online_mb)
        if config.path is None:   # model-free: only what this deployment serves (config validated online_mb)
            from vllm_treespec.ngram import empty_tries

            if vocab_limit is None:
                raise ValueError("an online-only lookup trie (drafter.path null) needs the model's vocab size")
            self.trie, plain = empty_tries(int(config.order or ONLINE_ONLY_ORDER), int(vocab_limit), 2)
        else:
            self.trie = load_checked_trie(config.path, tokenizer_dir, config.order)
            plain = self._frozen_twin(self.trie) if self.online else None
        sampled = getattr(config, "sampled_path", None)
        self.sampled_trie = (None if sampled is None else
                             load_checked_trie(sampled, tokenizer_dir, config.order,
                                               key="drafter.sampled_path"))
        # seeded sampled requests: the sampled trie (else the greedy one) without the online layer
        self.seeded_trie = None
        if self.online:
            self.seeded_trie = plain if self.sampled_trie is None else self._frozen_twin(self.sampled_trie)
            for trie in self._tries():
                trie.enable_online(capacity_mb=float(config.online_mb))
                if config.recent_max_ngram:
                    # measured about 30 bytes per token of capacity, index included (csrc/lookup/NOTES.md)
                    trie.enable_recent(max(64, int(config.recent_mb * (1 << 20)) // RECENT_BYTES_PER_TOKEN))
        self.chain = tree is None or tree.builder == "chain"
        self.max_depth = (tree.max_depth if tree is not None else None) or 8
        self.params = dict(min_ngram=int(config.min_ngram), max_ngram=int(config.max_ngram),
                           max_matches=int(config.max_matches), max_depth=int(self.max_depth),
                           k=int(config.k), min_context=int(config.min_context),
                           lookup_weight=float(config.lookup_weight),
                           min_path_prob=float(config.min_path_prob),
                           recent_max_ngram=int(config.recent_max_ngram),  # needs online_mb (config)
                           depth_per_match=float(config.depth_per_match))
        self.capabilities = DrafterCapabilities(
            observes_output=self.online, reads_sampling=self.sampled_trie is not None or self.online)

    @staticmethod
    def _frozen_twin(trie: Any) -> Any:
        """A second handle on an already checked trie file, with no online layer of its own."""
        from vllm_treespec.ngram import NgramTrie

        return NgramTrie.load(trie.path)

    def _tries(self) -> list[Any]:
        """The handles that learn online (when drafter.online_mb is set)."""
        return [self.trie] + ([self.sampled_trie] if self.sampled_trie is not None else [])

    def _trie_for(self, params: Any) -> Any:
        """The handle a request with these SamplingParams drafts from (class docstring)."""
        if not _samples(params):
            return self.trie
        if self.seeded_trie is not None and getattr(params, "seed", None) is not None:
            return self.seeded_trie
        return self.sampled_trie if self.sampled_trie is not None else self.trie

    def propose(self, inputs: DraftInputs) -> Proposal:
        params = {**self.params, "max_depth": inputs.max_depth(self.max_depth)}   # a table rule's depth
        if not inputs.sampling:
            return Proposal(native_trees(self.trie, inputs, chain=self.chain, **params))
        chosen = [self._trie_for(p) for p in inputs.sampling]
        handles = list({id(t): t for t in chosen}.values())
        if len(handles) == 1:
            return Proposal(native_trees(handles[0], inputs, chain=self.chain, **params))
        trees: list[DraftTree | None] = [None] * len(inputs)
        for trie in handles:
            index = np.array([i for i, t in enumerate(chosen) if t is trie], dtype=np.int64)
            for i, tree in zip(index, native_trees(trie, _subset(inputs, index), chain=self.chain,
                                                   **params)):
                trees[i] = tree
        return Proposal(trees)

    def counters(self) -> dict[str, int]:
        """The online layer's fill (tests and reports): tokens learnt, contexts held, evictions,
        and the tokens the recent outputs hold (drafter.recent_max_ngram)."""
        stats = self.trie.online_stats() if self.online else None
        if stats is None:
            return {}
        out = {"online_observed_tokens": int(stats["observed_tokens"]),
               "online_used_slots": int(stats["used_slots"]), "online_evictions": int(stats["evictions"])}
        recent = self.trie.recent_stats()
        if recent is not None:
            out["recent_held_tokens"] = int(recent["held_tokens"])
        return out

    def observe_output(self, tokens: np.ndarray) -> None:
        """Learn a finished request's output in the tries' online layers (drafter.online_mb);
        the drafter is not told the request's temperature, so both tries learn it."""
        if len(tokens) > 0:
            for trie in self._tries():
                trie.observe(tokens)

