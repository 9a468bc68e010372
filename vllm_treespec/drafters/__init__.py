"""Drafters: propose draft tokens for a batch of requests (no vLLM imports here).

`make_drafter(config)` maps a validated drafter config section to its drafter.
"""
from __future__ import annotations

from typing import Any

from vllm_treespec.drafters.base import DraftInputs, Drafter, DrafterCapabilities, Proposal, chain_trees


def make_drafter(drafter_config: Any, tokenizer_dir: str | None = None, tree_config: Any = None, *,
                 max_model_len: int = 4096, max_nodes: int = 64, vocab_limit: int | None = None) -> Drafter:
    """The drafter for a validated `drafter` config section, shaping trees as `tree_config` (the
    `tree` section; None = chains) says; `tokenizer_dir` is the served model's tokenizer
    (drafters with token-id files or their own model check it). Draft models size their caches
    by `max_model_len` and `max_nodes` (the node budget) and draft only ids < `vocab_limit`."""
    kind = drafter_config.type
    if kind == "prompt_lookup":
        from vllm_treespec.drafters.prompt_lookup import PromptLookupDrafter

        return PromptLookupDrafter(drafter_config, tree_config)
    if kind == "ngram_trie":
        from vllm_treespec.drafters.ngram_trie import NgramTrieDrafter

        return NgramTrieDrafter(drafter_config, tokenizer_dir, tree_config)
    if kind == "lookup_trie":
        from vllm_treespec.drafters.lookup_trie import LookupTrieDrafter

        return LookupTrieDrafter(drafter_config, tokenizer_dir, tree_config, vocab_limit=vocab_limit)
    if kind == "draft_model":
        from vllm_treespec.drafters.draft_model import DraftModelDrafter

        return DraftModelDrafter(drafter_config, tokenizer_dir, tree_config, max_model_len=max_model_len,
                                 max_nodes=max_nodes, vocab_limit=vocab_limit)
    if kind in ("dart", "jetspec"):
        from vllm_treespec.drafters.parallel_head import HeadDrafter

        return HeadDrafter(drafter_config, tokenizer_dir, tree_config, max_model_len=max_model_len,
                           max_nodes=max_nodes, vocab_limit=vocab_limit)
    raise ValueError(f"drafter.type {kind!r} has no drafter implementation")


__all__ = ["DraftInputs", "Drafter", "DrafterCapabilities", "Proposal", "chain_trees", "make_drafter"]
