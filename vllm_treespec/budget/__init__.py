"""Load-dependent node budgets (docs/budgets.md): how many draft nodes each request gets in
a step, chosen from the load.

    policy = make_budget_policy(config.budget, num_speculative_tokens)
    choice = policy.choose(batch_size, context_len)      # once per step, before drafting
    if choice.plain: ...                                  # budget 0: plain decoding, no drafter call
    ... draft with choice.nodes, build with choice.tree_params(config.tree.builder_params()) ...
    policy.observe(query_tokens=..., step_seconds=..., budgets=..., accepted=...,
                   drafted=..., drafter_seconds=...)     # after verification

Modes (`budget.mode`): fixed (`FixedBudget`, the same budget every step), table (`TableBudget`,
a checked batch-size / context-length table; presets in configs/budgets/) and auto (`AutoBudget`,
maximises predicted accepted tokens per second online, with hysteresis). Pure Python: no vLLM.

On top of any mode, `budget.reach_floor` (`ReachCap`, budget/reach.py) caps each request's nodes
at the depth it reaches with at least that probability, learnt from its own accepted drafts, and
`budget.gain` (budget/gain.py) drafts only what pays at the current load (docs/budgets.md).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Sequence

from vllm_treespec.budget.auto import AutoBudget, CostModel
from vllm_treespec.budget.base import BudgetChoice, BudgetPolicy, FixedBudget
from vllm_treespec.budget.reach import ReachCap
from vllm_treespec.budget.table import TableBudget, TableRule

if TYPE_CHECKING:
    from vllm_treespec.config import BudgetConfig

__all__ = ["AutoBudget", "BudgetChoice", "BudgetPolicy", "CostModel", "FixedBudget", "ReachCap",
           "TableBudget", "TableRule", "default_candidates", "make_budget_policy"]


def default_candidates(cap: int) -> list[int]:
    """0 (plain decoding), the powers of two below `cap`, and `cap`."""
    out, p = [0], 1
    while p < cap:
        out.append(p)
        p *= 2
    return out + [cap] if cap > 0 else out


def make_budget_policy(cfg: "BudgetConfig", num_speculative_tokens: int,
                       profile: Iterable[Sequence[float]] | None = None) -> BudgetPolicy:
    """The policy of a validated `budget` section, for a runtime with this num_speculative_tokens.

    Raises ConfigError where a budget exceeds num_speculative_tokens (not lowered by
    budget.max_nodes). `profile` ((query_tokens, seconds) points measured at startup) seeds the
    auto policy's cost model; None = budget.auto.profile from the config.
    """
    cfg.check_nodes(num_speculative_tokens)
    cap = cfg.max_nodes or num_speculative_tokens
    if cfg.mode == "fixed":
        return FixedBudget(cap)
    if cfg.mode == "table":
        rules = [TableRule(batch=(r.batch[0], r.batch[1]), nodes=r.nodes,
                           context=(r.context[0], r.context[1]) if r.context else (0, None),
                           max_depth=r.max_depth, builder_params=r.tree.builder_params())
                 for r in cfg.rules()]
        return TableBudget(rules, cap=cap, key=cfg.rules_key())
    a = cfg.auto
    cands = sorted({min(c, cap) for c in (a.candidates if a.candidates is not None
                                           else default_candidates(cap))})
    return AutoBudget(cands, profile=(a.profile or ()) if profile is None else profile,
                      margin=a.margin, patience=a.patience, explore_every=a.explore_every,
                      ema=a.ema, accept_ema=a.accept_ema, prior_gain=a.prior_gain,
                      prior_weight=a.prior_weight)
