"""DictTrie: a pure-Python nested-dict n-gram trie with exactly the C++ trie's semantics.

It is the reference the property tests compare the C++ trie against, and the baseline the
benchmark times. It counts k-grams straight from their definition (no window records, no
spilling), so it shares no code path with the C++ build.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Iterable, Sequence


class _Node:
    __slots__ = ("count", "total", "children")

    def __init__(self) -> None:
        self.count = 0
        self.total = 0
        self.children: dict[int, _Node] = {}


def stored_count(c: int, shift: int) -> int:
    """Count as stored in a trie file with this count_shift."""
    if c == 0:
        return 0
    return max(1, c if shift == 0 else (c + (1 << (shift - 1))) >> shift)


class DictTrie:
    """Counts of every k-gram (k <= order) in a list of token streams, with backoff queries."""

    def __init__(self, order: int) -> None:
        self.order = order
        self.root = _Node()
        self.online: dict[tuple[int, ...], dict[int, int]] = defaultdict(dict)
        self.online_total: dict[tuple[int, ...], int] = defaultdict(int)
        self.weight = 0.0

    @classmethod
    def build(cls, streams: Iterable[Sequence[int]], order: int, min_count: int = 1,
              max_count_bits: int = 32) -> DictTrie:
        """What `build_trie` produces from these streams (documents), as a dict trie."""
        t = cls(order)
        for s in streams:
            t._count(list(s))
        t._set_totals(t.root, 0)
        t._prune(t.root, 0, min_count)
        limit = (1 << max_count_bits) - 1
        shift = 0
        while stored_count(t.root.count, shift) > limit:
            shift += 1
        if shift:
            t._shift(t.root, shift)
        t.count_shift = shift
        return t

    def _count(self, s: list[int]) -> None:
        for i in range(len(s)):
            self.root.count += 1
            node = self.root
            for tok in s[i:i + self.order]:
                node = node.children.setdefault(tok, _Node())
                node.count += 1

    def _set_totals(self, node: _Node, depth: int) -> None:
        if depth < self.order:
            node.total = sum(c.count for c in node.children.values())
        for c in node.children.values():
            self._set_totals(c, depth + 1)

    def _prune(self, node: _Node, depth: int, min_count: int) -> None:
        if depth >= 1:  # children at depth >= 2
            node.children = {t: c for t, c in node.children.items() if c.count >= min_count}
        for c in node.children.values():
            self._prune(c, depth + 1, min_count)

    def _shift(self, node: _Node, shift: int) -> None:
        node.count = stored_count(node.count, shift)
        node.total = stored_count(node.total, shift)
        for c in node.children.values():
            self._shift(c, shift)

    # ------------------------------------------------------------------ online layer

    def observe(self, tokens: Sequence[int]) -> None:
        """Exact online counts (the C++ layer matches while no context overflows its slot)."""
        for i, t in enumerate(tokens):
            if t < 0:
                continue
            for length in range(0, min(i, self.order - 1) + 1):
                ctx = tuple(tokens[i - length:i])
                if length and ctx[0] < 0:
                    break
                self.online[ctx][t] = self.online[ctx].get(t, 0) + 1
                self.online_total[ctx] += 1

    # ------------------------------------------------------------------ queries

    def _context(self, context: Sequence[int]) -> list[int]:
        ctx = list(context)[-(self.order - 1):] if self.order > 1 else []
        for j in range(len(ctx) - 1, -1, -1):
            if ctx[j] < 0:
                return ctx[j + 1:]
        return ctx

    def _node(self, seq: Sequence[int]) -> _Node | None:
        node = self.root
        for tok in seq:
            node = node.children.get(tok)
            if node is None:
                return None
        return node

    def prob_order(self, context: Sequence[int], token: int, floor: float = 0.0) -> tuple[float, int]:
        """(probability, length of the suffix it came from; -1 for floor)."""
        ctx = self._context(context)
        w = self.weight
        for length in range(len(ctx), -1, -1):
            suffix = tuple(ctx[len(ctx) - length:])
            node = self._node(suffix)
            child = node.children.get(token) if node is not None else None
            cs = child.count if child is not None else 0
            co = self.online.get(suffix, {}).get(token, 0) if w or self.online else 0
            denom = (node.total if node is not None else 0) + w * self.online_total.get(suffix, 0)
            if (cs == 0 and co == 0) or not denom > 0:
                continue
            return (cs + w * co) / denom, length
        return floor, -1

    def prob(self, context: Sequence[int], token: int, floor: float = 0.0) -> float:
        return self.prob_order(context, token, floor)[0]

    def topk(self, context: Sequence[int], k: int) -> list[tuple[int, float]]:
        """Best k (token, prob) by prob descending, then token ascending."""
        ctx = self._context(context)
        tokens: set[int] = set()
        for length in range(len(ctx) + 1):
            suffix = tuple(ctx[len(ctx) - length:])
            node = self._node(suffix)
            if node is not None:
                tokens.update(node.children)
            tokens.update(self.online.get(suffix, {}))
        scored = [(t, self.prob(ctx, t)) for t in tokens]
        scored = [s for s in scored if s[1] > 0]
        scored.sort(key=lambda s: (-s[1], s[0]))
        return scored[:k]

    def num_nodes(self) -> int:
        stack, n = [self.root], 0
        while stack:
            node = stack.pop()
            n += 1
            stack.extend(node.children.values())
        return n
