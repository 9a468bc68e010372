"""Table budgets (`budget.mode: table`): a per-deployment table from load to node budget.

Why a table: the best budget depends mostly on how many requests share a step (JetSpec App. E
Table 11: 128 nodes win at batch 1-4 on an H100, 32 at batch 16) and is cheap to measure once per
hardware; a lookup costs nothing per step and never surprises an operator. Rules are checked when
the table is built: ranges may not overlap and must cover every batch size from 1 up (and, where
rules name context ranges, every context length), so every step has exactly one answer.
"""
from __future__ import annotations

import dataclasses
from types import MappingProxyType
from typing import Any, Mapping, Sequence

from vllm_treespec.budget.base import BudgetChoice, BudgetPolicy
from vllm_treespec.schema import ConfigError

INF = float("inf")


@dataclasses.dataclass(frozen=True)
class TableRule:
    """One row: steps whose batch size lies in `batch` and context length in `context` (both
    inclusive [first, last], last None = no upper limit) get `nodes` draft nodes per request
    (0 = plain decoding) and the tree overrides `max_depth` / `builder_params`."""
    batch: tuple[int, int | None]
    nodes: int
    context: tuple[int, int | None] = (0, None)
    max_depth: int | None = None
    builder_params: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def matches(self, batch_size: int, context_len: int) -> bool:
        return _inside(batch_size, self.batch) and _inside(context_len, self.context)


def _inside(x: int, r: tuple[int, int | None]) -> bool:
    return r[0] <= x and (r[1] is None or x <= r[1])


def _hi(r: tuple[int, int | None]) -> float:
    return INF if r[1] is None else r[1]


def _overlap(a: tuple[int, int | None], b: tuple[int, int | None]) -> bool:
    return a[0] <= _hi(b) and b[0] <= _hi(a)


def _fmt(r: tuple[int, int | None]) -> str:
    return f"[{r[0]}, {'null' if r[1] is None else r[1]}]"


def _span(lo: float, hi: float) -> str:
    return f"{int(lo)} and up" if hi == INF else (f"{int(lo)}" if lo == hi else f"{int(lo)}..{int(hi)}")


class TableBudget(BudgetPolicy):
    """Looks the step's (batch size, context length) up in a checked table of `TableRule`s.

    `cap` (budget.max_nodes) lowers any rule's nodes to at most cap. `key` is the config key of the
    table, used in error messages (e.g. "budget.table" or "budget.preset h100.yaml: table").
    """
    mode = "table"

    def __init__(self, rules: Sequence[TableRule], *, cap: int | None = None,
                 key: str = "budget.table") -> None:
        self.key = key
        self.rules = tuple(rules)
        _check_rules(self.rules, key)
        self.cap = cap
        self._choices = tuple(   # shared by every lookup: read-only overrides
            BudgetChoice(min(r.nodes, cap) if cap is not None else r.nodes, r.max_depth,
                         MappingProxyType(dict(r.builder_params)))
            for r in self.rules)
        self._uses_context = any(r.context != (0, None) for r in self.rules)
        self.chooses_by_batch_size = not self._uses_context
        super().__init__(max(c.nodes for c in self._choices))

    def lookup(self, batch_size: int, context_len: int = 0) -> BudgetChoice:
        """The choice of the rule covering (batch_size, context_len); batch sizes below 1 count as 1."""
        b = max(1, int(batch_size))
        c = max(0, int(context_len)) if self._uses_context else 0
        for rule, choice in zip(self.rules, self._choices):
            if rule.matches(b, c):
                return choice
        raise AssertionError(f"{self.key}: checked table covers no ({b}, {c})")  # _check_rules bug

    choose = lookup

    def vllm_schedule(self, max_batch_size: int, context_len: int = 0) -> list[tuple[int, int, int]]:
        """The table as vLLM's `num_speculative_tokens_per_batch_size` ([(first, last, K), ...],
        inclusive, up to max_batch_size), at one context length: lets the scheduler size draft slots
        per batch size (docs/design.md section 5)."""
        c = max(0, int(context_len))
        out = []
        for rule, choice in zip(self.rules, self._choices):
            lo, hi = rule.batch
            if _inside(c, rule.context) and lo <= max_batch_size:
                out.append((lo, max_batch_size if hi is None else min(hi, max_batch_size), choice.nodes))
        return sorted(out)

    def state(self) -> dict[str, Any]:
        return {**super().state(), "rules": [
            {"batch": list(r.batch), "context": list(r.context), "nodes": c.nodes} for r, c in
            zip(self.rules, self._choices)]}


def _check_rules(rules: Sequence[TableRule], key: str) -> None:
    """Ranges well formed, pairwise disjoint, covering batch >= 1 x context >= 0."""
    if not rules:
        raise ConfigError(f"{key}: the table is empty; add rules covering batch sizes 1 and up, "
                          "e.g. [{batch: [1, null], nodes: 8}]")
    for i, r in enumerate(rules):
        if r.nodes < 0:
            raise ConfigError(f"{key}[{i}].nodes: {r.nodes} is negative; use 0 for plain decoding")
        for name, rng, least in (("batch", r.batch, 1), ("context", r.context, 0)):
            lo, hi = rng
            if lo < least or hi is not None and hi < lo:
                raise ConfigError(f"{key}[{i}].{name}: {_fmt(rng)} is not a range of {name} "
                                  f"{'sizes' if name == 'batch' else 'lengths'}; write [first, last] "
                                  f"with {least} <= first <= last (last null = no upper limit)")
    for j, b in enumerate(rules):
        for i, a in enumerate(rules[:j]):
            if _overlap(a.batch, b.batch) and _overlap(a.context, b.context):
                # Rules with equal batch ranges can only be told apart by context: name that key.
                name = "context" if a.batch == b.batch and a.context != b.context else "batch"
                where = f"batch {_fmt(a.batch)}"
                if a.context != (0, None) or b.context != (0, None):
                    where += f", context {_fmt(a.context)}"
                raise ConfigError(
                    f"{key}[{j}].{name}: {_fmt(getattr(b, name))} overlaps {key}[{i}] ({where}); each "
                    f"step must match one rule only: make the {name} ranges disjoint")
    _check_cover(rules, key)


def _check_cover(rules: Sequence[TableRule], key: str) -> None:
    """Every cell of the grid cut by the rules' edges must lie in some rule; name the first gap."""
    def edges(attr: str, least: int) -> list[float]:
        cut = {least}
        for r in rules:
            lo, hi = getattr(r, attr)
            cut.add(lo)
            if hi is not None:
                cut.add(hi + 1)
        return sorted(cut) + [INF]

    bs, cs = edges("batch", 1), edges("context", 0)
    with_context = any(r.context != (0, None) for r in rules)
    for ci in range(len(cs) - 1):
        c_lo, c_hi = cs[ci], cs[ci + 1] - 1
        bi = 0
        while bi < len(bs) - 1:
            if any(r.matches(int(bs[bi]), int(c_lo)) for r in rules):
                bi += 1
                continue
            g_lo = bs[bi]
            while bi < len(bs) - 1 and not any(r.matches(int(bs[bi]), int(c_lo)) for r in rules):
                bi += 1
            g_hi = bs[bi] - 1
            raise ConfigError(_gap_message(rules, key, (g_lo, g_hi), (c_lo, c_hi), with_context))


def _gap_message(rules: Sequence[TableRule], key: str, gap: tuple[float, float],
                 ctx: tuple[float, float], with_context: bool) -> str:
    what = f"batch sizes {_span(*gap)}" + (f" at context lengths {_span(*ctx)}" if with_context else "")
    cover = "rules must cover every batch size from 1 up" + (
        " and every context length" if with_context else "")
    for i, r in enumerate(rules):   # a rule ending right before the gap
        if r.batch[1] is not None and r.batch[1] + 1 == gap[0] and _inside(int(ctx[0]), r.context):
            return (f"{key}[{i}].batch: ends at {r.batch[1]} and no rule covers {what}; "
                    f"extend it (null = no upper limit) or add a rule from {int(gap[0])} ({cover})")
    for i, r in enumerate(rules):   # the batch is covered at other context lengths only
        if _inside(int(gap[0]), r.batch) and r.context[1] is not None and r.context[1] + 1 == ctx[0]:
            return (f"{key}[{i}].context: ends at {r.context[1]} and no rule covers {what}; "
                    f"extend it (null = no upper limit) or add a rule from context {int(ctx[0])} ({cover})")
    for i, r in enumerate(rules):   # a rule starting right after the gap
        if gap[1] != INF and r.batch[0] == gap[1] + 1 and _inside(int(ctx[0]), r.context):
            return (f"{key}[{i}].batch: starts at {r.batch[0]} and no rule covers {what}; "
                    f"start it at {int(gap[0])} or add a rule for them ({cover})")
    return f"{key}: no rule covers {what}; add one ({cover})"
