"""Cache slots of a draft LM runtime: which request owns which preallocated slot, and what the
slot holds (the token ids it consumed), with least-recently-used eviction.

Memory is bounded by the number of slots, fixed at construction; a request that cannot get a
slot drafts nothing that step, it never grows the cache.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterable, Sequence

import numpy as np

__all__ = ["SlotTable", "SlotOwner", "common_prefix"]


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the longest common prefix of two int arrays."""
    n = min(a.shape[0], b.shape[0])
    if n == 0:
        return 0
    diff = np.nonzero(a[:n] != b[:n])[0]
    return int(diff[0]) if diff.size else n


class SlotTable:
    """Request id -> slot index, with the tokens each slot's cache was built from and a
    generation per slot (bumped whenever the slot changes hands, so a runtime can tell that a
    slot it planned with was evicted or released in between)."""

    def __init__(self, num_slots: int) -> None:
        if num_slots < 1:
            raise ValueError(f"a draft LM cache needs at least one slot, got {num_slots}")
        self.num_slots = num_slots
        self.consumed: list[np.ndarray] = [np.zeros(0, np.int64)] * num_slots   # token ids held
        self.generation = np.zeros(num_slots, dtype=np.int64)
        self._owner: OrderedDict[str, int] = OrderedDict()               # LRU order, oldest first
        self._free = list(range(num_slots - 1, -1, -1))
        self.evictions = 0

    def slot(self, req_id: str) -> int | None:
        return self._owner.get(req_id)

    def num_owners(self) -> int:
        """Requests holding a slot."""
        return len(self._owner)

    def length(self, slot: int) -> int:
        """Committed tokens the slot's cache holds."""
        return int(self.consumed[slot].shape[0])

    def admit(self, req_ids: Sequence[str]) -> np.ndarray:
        """Slots for these requests (bool [B]: got one); evicts the least recently used
        requests that are not in `req_ids`; new slots start empty."""
        ok = np.zeros(len(req_ids), dtype=bool)
        wanted = set(req_ids)
        for i, r in enumerate(req_ids):
            s = self._owner.get(r)
            if s is not None:
                self._owner.move_to_end(r)
                ok[i] = True
                continue
            if not self._free:
                victim = next((v for v in self._owner if v not in wanted), None)
                if victim is None:
                    continue
                self._vacate(self._owner.pop(victim))
                self.evictions += 1
            s = self._free.pop()
            self._owner[r] = s
            ok[i] = True
        return ok

    def release(self, req_ids: Iterable[str]) -> None:
        for r in req_ids:
            s = self._owner.pop(r, None)
            if s is not None:
                self._vacate(s)

    def _vacate(self, slot: int) -> None:
        self.consumed[slot] = np.zeros(0, np.int64)
        self.generation[slot] += 1
        self._free.append(slot)

    def reuse(self, slot: int, context: np.ndarray) -> int:
        """How many leading tokens of `context` the slot's cache already holds."""
        return common_prefix(self.consumed[slot], context)

    def record(self, slot: int, context: np.ndarray) -> None:
        """The slot's cache now holds exactly `context` (copied)."""
        self.consumed[slot] = np.array(context, dtype=np.int64)


class SlotOwner:
    """The slot half of the DraftLM protocol (base.py), shared by every runtime that keeps its
    per-request caches in a `SlotTable` at ``self.slots``."""

    slots: SlotTable

    def admit(self, req_ids: Sequence[str]) -> np.ndarray:
        """bool [B]: which requests hold a cache slot for this step (LRU eviction outside the call).
        A new owner's slot has consumed nothing, so nothing cached for its slot is reused."""
        return self.slots.admit(req_ids)

    def release(self, req_ids: Iterable[str]) -> None:
        """Forget these requests' caches (unknown ids are ignored)."""
        self.slots.release(req_ids)

    def tracked_requests(self) -> int:
        """Requests holding a cache slot."""
        return self.slots.num_owners()

    @property
    def evictions(self) -> int:
        return self.slots.evictions

    def cached_tokens(self, req_id: str) -> int:
        """Committed tokens the request's cache has consumed (0 when it has no slot)."""
        slot = self.slots.slot(req_id)
        return 0 if slot is None else self.slots.length(slot)
