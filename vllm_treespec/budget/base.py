"""What a budget policy returns and the one interface every policy has (docs/budgets.md).

Why one small interface: the engine asks "how many draft nodes per request this step?" once per
step and reports what happened afterwards; whether the answer comes from a constant, a table or an
online model is the deployment's choice (`budget.mode`), not the engine's concern.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Sequence


@dataclasses.dataclass(frozen=True)
class BudgetChoice:
    """The budget for one step.

    `nodes == 0` means plain decoding this step: do not call the drafter, build no tree metadata,
    verify one token per request (the `plain` property). `max_depth` (None = keep tree.max_depth)
    and `builder_params` (extra `build_tree` keyword arguments, e.g. {"topk": 4}) are overrides of
    the tree section for this step; `tree_params` merges them. `explored` marks an exploration step
    of the auto policy (a neighbouring budget tried to keep its acceptance estimate fresh).
    """
    nodes: int
    max_depth: int | None = None
    builder_params: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    explored: bool = False

    @property
    def plain(self) -> bool:
        """True when this step decodes without speculation (no drafter call, no tree)."""
        return self.nodes == 0

    def tree_params(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """`build_tree` keyword arguments: the tree section's `base` with this choice's overrides."""
        params = {**base, **self.builder_params}
        if self.max_depth is not None:
            params["max_depth"] = self.max_depth
        return params


class BudgetPolicy:
    """Chooses the node budget of a step from the load and learns from what the step cost.

    Call `choose` once per step before drafting (batch_size = requests decoding this step,
    context_len = their mean context length in tokens; the table policy is cheap enough to call per
    request with each request's own length). After verification call `observe` with what happened.
    `max_nodes` is the largest `nodes` any choice can have (size drafter buffers with it).
    """
    mode: str = "base"
    learns: bool = False      # whether `observe` changes later choices (else callers may skip it)
    # whether `choose` reads the batch size alone (not the context length, not what it learned):
    # then a batch that stays the same keeps its choice (engine/budget_control.py's quiet stretch)
    chooses_by_batch_size: bool = False

    def __init__(self, max_nodes: int) -> None:
        self.max_nodes = int(max_nodes)

    def choose(self, batch_size: int, context_len: int = 0) -> BudgetChoice:
        raise NotImplementedError

    def observe(self, *, query_tokens: int, step_seconds: float, budgets: Sequence[int],
                accepted: Sequence[int], drafted: Sequence[int] | None = None,
                drafter_seconds: float = 0.0) -> None:
        """Report one finished step.

        query_tokens: tokens the target verified this step (all requests; root + draft nodes, plus
        any prefill tokens scheduled with them). step_seconds: the target's forward + verification
        time of the step, without drafting. budgets[i] / accepted[i]: request i's node budget this
        step (0 = it did not draft) and how many of its draft tokens were accepted (the bonus token
        not counted). drafted[i]: nodes request i actually drafted (None = its full budget).
        drafter_seconds: drafter + tree builder time of the step. Policies that do not learn
        ignore it.
        """

    def state(self) -> dict[str, Any]:
        """A JSON-able summary for logs and metrics."""
        return {"mode": self.mode, "max_nodes": self.max_nodes}


class FixedBudget(BudgetPolicy):
    """Today's behaviour (`budget.mode: fixed`): the same budget every step, whatever the load."""
    mode = "fixed"
    chooses_by_batch_size = True

    def __init__(self, nodes: int) -> None:
        if nodes < 0:
            raise ValueError(f"a node budget is >= 0, got {nodes}")
        super().__init__(nodes)
        self._choice = BudgetChoice(int(nodes))

    def choose(self, batch_size: int, context_len: int = 0) -> BudgetChoice:
        return self._choice
