"""N-gram trie: build from token streams, freeze to an mmap-able file, query with backoff.

No vLLM imports here: drafters and tree scorers use this package, and it is testable alone.

    from vllm_treespec.ngram import NgramTrie, build_trie, tokenizer_fingerprint
    build_trie(["corpus/"], "code.trie", tokenizer="MODEL_DIR", order=3, workers=2)
    trie = NgramTrie.load("code.trie", expected_fingerprint=tokenizer_fingerprint("MODEL_DIR"))
    trie.prob(context_ids, candidate_ids); trie.topk(context_ids, 8)
    cur = trie.cursors(contexts); cur = trie.advance(cur[parents], tokens); trie.prob_cursors(cur, cands)

Names are imported lazily, so `vllm_treespec.ngram.cli` (argument parsing) loads neither numpy
nor the C++ extension.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BuildOptions": "build", "build_trie": "build", "build_trie_from_streams": "build", "empty_tries": "build",
    "TokenizerMismatchError": "errors", "TrieFormatError": "errors",
    "tokenizer_fingerprint": "fingerprint",
    "CURSOR_DTYPE": "trie", "NgramTrie": "trie", "load_trie": "trie",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    globals()[name] = value
    return value
