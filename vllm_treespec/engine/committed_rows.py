"""Which flat rows of the step that just ran each request committed, for drafters that read the
target's hidden states (drafters.base.TargetStates): every scheduled row of a plain step or a
prefill chunk, the root and its accepted path for a verified tree.
"""
from __future__ import annotations

import numpy as np

from vllm_treespec.engine.tree_step import TreeStep

__all__ = ["CommittedRows"]

_NO_TREES = np.zeros((0, 1), dtype=np.int64)     # a plain step's accepted nodes (never written)
_NO_TREES.flags.writeable = False


class CommittedRows:
    def __init__(self) -> None:
        self.step: TreeStep | None = None               # the last tree step's plan (None: plain step)
        self.accepted = np.zeros((0, 1), dtype=np.int64)   # [num_trees, W] its accepted nodes (-1 pad)
        self.plain_query_start: np.ndarray | None = None   # the last plain step's query_start_loc

    def plain(self, query_start_loc: np.ndarray) -> None:
        """A plain step: every scheduled row is committed (`query_start_loc` is copied: the
        runner reuses its buffer)."""
        self.plain_query_start = query_start_loc.copy()
        self.step, self.accepted = None, _NO_TREES

    def planned(self, step: TreeStep) -> None:
        """A tree step before sampling: every scheduled row, until `verified` narrows its trees."""
        self.step, self.accepted = step, np.full((step.num_trees, 1), -1, dtype=np.int64)

    def verified(self, step: TreeStep, accepted_nodes: np.ndarray) -> None:
        self.step, self.accepted = step, accepted_nodes

    def rows(self, num_reqs: int) -> list[np.ndarray]:
        """Flat step rows of each request's committed tokens, in batch order."""
        step, accepted = self.step, self.accepted
        if step is None:
            qsl = self.plain_query_start
            if qsl is None or qsl.size != num_reqs + 1:
                return [np.zeros(0, dtype=np.int64)] * num_reqs
            return [np.arange(qsl[i], qsl[i + 1], dtype=np.int64) for i in range(num_reqs)]
        qsl = step.query_start_loc
        rows = [np.arange(qsl[i], qsl[i + 1], dtype=np.int64) for i in range(step.num_reqs)]
        for j, i in enumerate(step.req_indices.tolist()):    # trees: root + accepted path only
            path = accepted[j][accepted[j] >= 0]
            rows[i] = qsl[i] + np.concatenate([[0], path]).astype(np.int64)
        return rows
