"""NgramTrie: the Python face of a frozen n-gram trie (mmap'ed by the C++ core, shared page cache).

Probabilities use longest-context backoff as in DART (App. C): a candidate token t after a context
takes P(t | u) = count(u t) / total(u) from the longest suffix u of the context (at most order-1
tokens) whose node has t as a child, where total(u) counts every continuation of u seen at build
time (pruned ones included). Tokens that no suffix contains, not even the empty context (never
seen, or unknown ids), get `floor` (default 0.0, so callers pick their own epsilon as DART's
log(p + eps)). Scores are not renormalised across backoff levels. A negative token in a context
means "no token" (padding, a boundary): only the tokens after it count.

The optional online layer (enable_online/observe) adds counts from served outputs with a weight:
count + w * online_count over total + w * online_total at each level.

Every query releases the GIL; any number of threads may query one trie (the mapping is
immutable; the online layer has a readers-writer lock).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vllm_treespec.native import native
from vllm_treespec.ngram.errors import TokenizerMismatchError
from vllm_treespec.ngram.fingerprint import short

_NG = native().ngram
CURSOR_DTYPE: np.dtype = _NG.CURSOR_DTYPE
TokenRows = Sequence[Sequence[int]] | np.ndarray


class NgramTrie:
    """A loaded trie file. Build one with `build_trie` / `vllm-treespec ngram build`."""

    def __init__(self, handle: Any) -> None:
        self._t = handle
        self._header = handle.header()

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(cls, path: str | Path, *, expected_fingerprint: str | None = None,
             verify: bool = False) -> NgramTrie:
        """Map `path` read-only. O(1) in the file size unless `verify` (a full O(file) check).

        expected_fingerprint: the served model's `tokenizer_fingerprint(...)`; a different one in
        the file raises TokenizerMismatchError. Unusable files raise TrieFormatError.
        """
        p = Path(path)
        if not p.exists():
            raise FileNotFoundError(f"n-gram trie {p} does not exist; build it with `vllm-treespec ngram build`")
        trie = cls(_NG.Trie.open(str(p)))
        if expected_fingerprint is not None:
            trie.check_fingerprint(expected_fingerprint)
        if verify:
            trie.verify()
        return trie

    def check_fingerprint(self, expected: str) -> None:
        """Raise TokenizerMismatchError unless the trie was built with the tokenizer `expected` hashes."""
        mine = self.fingerprint
        if mine == expected.lower():
            return
        name = f" {self.tokenizer_name!r}" if self.tokenizer_name else ""
        if mine is None:
            raise TokenizerMismatchError(
                f"trie {self.path} was built from token ids without a tokenizer fingerprint but the served model "
                f"uses tokenizer {short(expected)}; rebuild with --tokenizer MODEL_DIR")
        raise TokenizerMismatchError(
            f"trie {self.path} was built with tokenizer{name} {short(mine)} but the served model uses "
            f"{short(expected)}; rebuild with --tokenizer MODEL_DIR")

    def verify(self) -> None:
        """Full structural and checksum verification (reads the whole file); raises TrieFormatError."""
        self._t.verify()

    # ------------------------------------------------------------------ metadata

    @property
    def path(self) -> str:
        return self._t.path

    @property
    def order(self) -> int:
        return self._t.order

    @property
    def vocab_size(self) -> int:
        return self._t.vocab_size

    @property
    def num_nodes(self) -> int:
        return self._t.num_nodes

    @property
    def fingerprint(self) -> str | None:
        """Hex tokenizer fingerprint stored in the header (None when built without a tokenizer)."""
        raw: bytes = self._header["tokenizer_fingerprint"]
        return None if not any(raw) else raw.hex()

    @property
    def tokenizer_name(self) -> str:
        return self._header["tokenizer_name"].decode("utf-8", errors="replace")

    @property
    def header(self) -> dict[str, Any]:
        return dict(self._header)

    def stats(self) -> dict[str, Any]:
        """Header plus derived numbers (bytes per node, per-depth node counts)."""
        h = self.header
        return {
            "path": self.path, "order": h["order"], "vocab_size": h["vocab_size"],
            "format_version": h["format_version"], "file_bytes": h["file_size"], "num_nodes": h["num_nodes"],
            "bytes_per_node": h["file_size"] / h["num_nodes"], "level_sizes": h["level_sizes"],
            "total_tokens": h["total_tokens"], "min_count": h["min_count"], "count_shift": h["count_shift"],
            "top_lists": h["num_top_nodes"], "dense_nodes": h["num_dense_nodes"], "tokenizer": self.tokenizer_name,
            "tokenizer_fingerprint": self.fingerprint,
        }

    # ------------------------------------------------------------------ one context

    def prob(self, context: Sequence[int], candidates: Sequence[int], *, floor: float = 0.0) -> np.ndarray:
        """P(candidate | context) for each candidate, float64 [K]."""
        return self.prob_batch(self._rows([context]), np.asarray(candidates, dtype=np.int32), floor=floor)[0]

    def topk(self, context: Sequence[int], k: int) -> list[tuple[int, float]]:
        """The k most probable next tokens as (token, prob), best first (ties: smaller token)."""
        toks, probs, found = self.topk_batch(self._rows([context]), k)
        return [(int(toks[0, j]), float(probs[0, j])) for j in range(int(found[0]))]

    # ------------------------------------------------------------------ batches

    def prob_batch(self, contexts: TokenRows, candidates: TokenRows, *, floor: float = 0.0,
                   return_orders: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """[B, K] float64 probabilities; candidates are [K] (shared) or [B, K].

        With return_orders, also the [B, K] int8 length of the suffix each probability came from
        (-1: floor).
        """
        return self._t.prob_contexts(self._rows(contexts), self._cands(candidates), floor, return_orders)

    def topk_batch(self, contexts: TokenRows, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """([B, k] int32 tokens padded with -1, [B, k] float64 probs padded with 0, [B] counts found)."""
        return self._t.topk_contexts(self._rows(contexts), int(k))

    # ------------------------------------------------------------------ cursors

    def cursors(self, contexts: TokenRows) -> np.ndarray:
        """One cursor per context (1-D array of CURSOR_DTYPE; index it to reorder or fork beams)."""
        return self._t.cursors(self._rows(contexts))

    def cursor(self, context: Sequence[int] = ()) -> np.ndarray:
        """A batch of one cursor."""
        return self.cursors(self._rows([context]))

    def advance(self, cursors: np.ndarray, tokens: Sequence[int] | np.ndarray) -> np.ndarray:
        """New cursors: each cursor extended by its token (O(order) lookups, no re-walk)."""
        return self._t.advance(cursors, np.asarray(tokens, dtype=np.int32))

    def prob_cursors(self, cursors: np.ndarray, candidates: TokenRows, *, floor: float = 0.0,
                     return_orders: bool = False) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Like prob_batch, for cursors."""
        return self._t.prob(cursors, self._cands(candidates), floor, return_orders)

    def topk_cursors(self, cursors: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Like topk_batch, for cursors."""
        return self._t.topk(cursors, int(k))

    # ------------------------------------------------------------------ tree scoring

    def scorer(self, floor: float = 0.0) -> Any:
        """This trie as a C++ n-gram scorer (`_C.ngram.TrieNgram`, an `_C.NgramScorer`) for the C++
        tree builders: log prob(candidate | context) with the same backoff, log(floor) for unseen
        candidates. It keeps the file mapped and the online layer active now (a later
        enable_online() needs a new scorer)."""
        return self._t.scorer(float(floor))

    # ------------------------------------------------------------------ online layer

    def enable_online(self, capacity_mb: float = 16.0, weight: float = 1.0) -> None:
        """Start a fresh bounded online layer (capacity_mb of memory; counts scaled by weight)."""
        self._t.enable_online(int(capacity_mb * (1 << 20)), float(weight))

    def disable_online(self) -> None:
        self._t.disable_online()

    def observe(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Learn from one served output (prompt + completion token ids)."""
        self._t.observe(np.asarray(tokens, dtype=np.int32).reshape(-1))

    def clear_online(self) -> None:
        self._t.clear_online()

    def online_stats(self) -> dict[str, Any] | None:
        return self._t.online_stats()

    def enable_recent(self, capacity_tokens: int) -> None:
        """Keep the observed outputs themselves (up to capacity_tokens, oldest half dropped when
        full) so lookup trees can match a request's longer suffix in them (recent_max_ngram;
        csrc/lookup/recent_outputs.h). observe() feeds both this and the online layer."""
        self._t.enable_recent(int(capacity_tokens))

    def recent_stats(self) -> dict[str, Any] | None:
        return self._t.recent_stats()

    # ------------------------------------------------------------------ helpers

    def _rows(self, contexts: TokenRows) -> np.ndarray:
        """[B, L] int32 with only the last order-1 tokens of each context (left-padded with -1)."""
        keep = self.order - 1
        if isinstance(contexts, np.ndarray):
            if contexts.ndim != 2:
                raise ValueError("contexts must be 2-D [batch, length]")
            arr = contexts[:, contexts.shape[1] - min(keep, contexts.shape[1]):]
            return np.ascontiguousarray(arr, dtype=np.int32)
        out = np.full((len(contexts), keep), -1, dtype=np.int32)
        if keep:
            for i, ctx in enumerate(contexts):
                tail = list(ctx)[-keep:]
                if tail:
                    out[i, keep - len(tail):] = tail
        return out

    @staticmethod
    def _cands(candidates: TokenRows) -> np.ndarray:
        arr = np.asarray(candidates)
        if arr.dtype == object:
            raise ValueError("candidates must be [K] or [B, K] (rectangular)")
        return np.ascontiguousarray(arr, dtype=np.int32)


def load_trie(path: str | Path, *, expected_fingerprint: str | None = None, verify: bool = False) -> NgramTrie:
    """Shorthand for NgramTrie.load."""
    return NgramTrie.load(path, expected_fingerprint=expected_fingerprint, verify=verify)
