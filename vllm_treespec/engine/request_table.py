"""One record per request the proposer serves, in one table.

Why one record: a request's drafting state (its fixed options, last tree and q rows, node cap,
acceptance generator, counters, and its state in the budget rules: `ReachRecord`, `GainRecord`)
is freed in one step when vLLM reports the request finished (`TreeProposer.on_requests_finished`,
which also releases the drafter's own per-request state); a record cannot be half freed, as one
of several tables could be forgotten.
"""
from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import torch

from vllm_treespec.budget.gain import GainControl, GainRecord, gain_class
from vllm_treespec.budget.reach import SAMPLED, ReachCap, ReachRecord
from vllm_treespec.budget.shadow import ShadowProbe
from vllm_treespec.drafters.base import Proposal
from vllm_treespec.engine.eligibility import pending_min_tokens, static_blocker
from vllm_treespec.engine.request_options import RequestOptionError, parse_request_options
from vllm_treespec.engine.runner_state import request_progress
from vllm_treespec.tree import DraftTree

from vllm.logger import init_logger

logger = init_logger(f"vllm.{__name__}")

__all__ = ["RequestState", "RequestTable"]


@dataclass
class RequestState:
    """What the proposer keeps of one request until it finishes or is aborted."""
    steps: int = 0                      # decode steps it took part in
    drafted: int = 0
    accepted: int = 0
    fallback_steps: dict[str, int] = field(default_factory=dict)   # steps without drafts, by reason
    # fixed options, read once from its SamplingParams (`read_options`)
    options_checked: bool = False
    blocker: str | None = None          # request option that keeps it from drafting
    max_nodes: int | None = None        # its own cap (extra_args treespec.max_nodes)
    seeded_sampled: bool = False        # its tokens depend on its trees (budget/gain.py)
    gain_class: str | None = None       # unseeded sampled: its class for budget.gain's priors
    # drafting and verification
    tree: DraftTree | None = None       # its last drafts (None: it has none)
    draft_probs: Any = None             # DraftProbs of that tree when drawn from the drafter's q
    budget_given: int = 0               # the node cap of its last drafts
    reach_class: str | None = None      # greedy / sampled, kept with budget.reach_floor
    generator: torch.Generator | None = None   # tree acceptance's own stream (seeded sampled)
    # its state in the budget rules (engine/budget_control.py), made on first use
    reach: ReachRecord | None = None    # budget.reach_floor: its acceptance counts by depth and cap
    gain: GainRecord | None = None      # budget.gain: its acceptance, probe schedule and class
    rated: Any = None                   # budget.gain.confidence: (float [n] scores, int8 [n] sources)
                                        # of its kept nodes (greedy requests only) until verified
    shadow: ShadowProbe | None = None   # budget.gain: its probe waiting for the tokens it samples

    def read_options(self, params: Any) -> None:
        """The request's fixed options: what keeps it from drafting, its own node cap
        (extra_args, engine/request_options.py) and whether it samples with a seed."""
        self.blocker, self.options_checked = static_blocker(params), True
        try:
            self.max_nodes = parse_request_options(getattr(params, "extra_args", None)).max_nodes
        except RequestOptionError as e:       # checked at admission; never guess past a bad value
            logger.warning("TreeProposer: %s; the request is served without drafts", e)
            self.max_nodes = 0
        temperature = getattr(params, "temperature", None)
        self.seeded_sampled = (getattr(params, "seed", None) is not None
                               and ReachCap.sampling_class(temperature) == SAMPLED)
        self.gain_class = None if self.seeded_sampled else gain_class(temperature)

    @property
    def is_greedy(self) -> bool:
        """Greedy: neither seeded sampled nor in a sampled class (its tokens never depend on its
        trees). Known once its options were read (`read_options`)."""
        return self.options_checked and not self.seeded_sampled and self.gain_class is None

    def reach_record(self, rule: ReachCap) -> ReachRecord:
        """Its budget.reach_floor record, made on first use."""
        if self.reach is None:
            self.reach = rule.new_record()
        return self.reach

    def gain_record(self, rule: GainControl) -> GainRecord:
        """Its budget.gain record, made on first use."""
        if self.gain is None:
            self.gain = rule.new_record()
        return self.gain

    def blocker_now(self, progress: tuple[Any, int] | None) -> str | None:
        """Why it may not be verified as a tree this step (None = it may). `progress` =
        (SamplingParams, output tokens so far), None when the runner does not know it. Fixed
        options are read once (engine/eligibility.py); only a pending min_tokens changes."""
        if progress is None:
            return self.blocker
        params, num_output = progress
        if not self.options_checked:
            self.read_options(params)
        if self.blocker is None and pending_min_tokens(params, num_output):
            return "min_tokens"
        return self.blocker


class RequestTable:
    """req id -> RequestState. Records are made on first use and dropped by `release` alone."""

    def __init__(self) -> None:
        self._states: dict[str, RequestState] = {}
        # the mappings the step planner and tree acceptance take (engine/tree_step.py,
        # engine/tree_verifier.py): one field of every record
        self.trees = _Field(self, "tree")
        self.draft_probs = _Field(self, "draft_probs")
        self.generators = _Field(self, "generator")

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, req_id: object) -> bool:
        return req_id in self._states

    def __getitem__(self, req_id: str) -> RequestState:
        return self._states[req_id]

    def __iter__(self) -> Iterator[str]:
        return iter(self._states)

    def get(self, req_id: str) -> RequestState | None:
        return self._states.get(req_id)

    def values(self) -> Iterable[RequestState]:
        return self._states.values()

    def state(self, req_id: str) -> RequestState:
        """The request's record, made on its first use."""
        st = self._states.get(req_id)
        if st is None:
            st = self._states[req_id] = RequestState()
        return st

    def blocker(self, req_id: str, runner: Any) -> str | None:
        """Why this request may not be verified as a tree this step (None = it may)."""
        return self.state(req_id).blocker_now(request_progress(runner, req_id))

    def release(self, req_ids: Iterable[str]) -> None:
        for req_id in req_ids:
            self._states.pop(req_id, None)

    def record_drafts(self, req_ids: Sequence[str], proposal: Proposal | None, decoding: Sequence[bool],
                      caps: Sequence[int]) -> list[list[int]]:
        """Keep each request's tree (and q rows) of this step, None for no drafts (`proposal`
        None: nobody drafted); count decode steps. Returns the draft tokens per request."""
        if proposal is None:
            return self._record_no_drafts(req_ids, decoding, caps)
        drafts: list[list[int]] = []
        probs = proposal.draft_probs
        for i, req_id in enumerate(req_ids):
            tree = proposal.trees[i]
            has_drafts = tree is not None and tree.num_draft > 0
            st = self.state(req_id) if decoding[i] or has_drafts else self._states.get(req_id)
            if st is not None:
                st.tree, st.draft_probs = (tree, probs.get(i)) if has_drafts else (None, None)
            drafts.append(tree.draft_token_ids() if has_drafts else [])
            if decoding[i]:
                st.steps += 1
                st.drafted += tree.num_draft if has_drafts else 0
                st.budget_given = caps[i]
        return drafts

    def _record_no_drafts(self, req_ids: Sequence[str], decoding: Sequence[bool],
                          caps: Sequence[int]) -> list[list[int]]:
        """`record_drafts` for a step in which nobody drafted (most sampled steps), without its
        per-request tree bookkeeping."""
        for req_id, decodes, cap in zip(req_ids, decoding, caps):
            st = self.state(req_id) if decodes else self._states.get(req_id)
            if decodes:
                st.steps += 1
                st.budget_given = cap
            if st is not None and st.tree is not None:
                st.tree = st.draft_probs = None
        return [[] for _ in req_ids]

    def count_accepted(self, req_ids: Sequence[str], accepted: Sequence[int]) -> None:
        for req_id, a in zip(req_ids, accepted):
            st = self._states.get(req_id)
            if st is not None:
                st.accepted += a


class _Field(MutableMapping):
    """One field of every record as a mapping req id -> value (a None field is absent)."""

    def __init__(self, table: RequestTable, name: str) -> None:
        self._table, self._name = table, name

    def __getitem__(self, req_id: str) -> Any:
        st = self._table.get(req_id)
        value = None if st is None else getattr(st, self._name)
        if value is None:
            raise KeyError(req_id)
        return value

    def __setitem__(self, req_id: str, value: Any) -> None:
        setattr(self._table.state(req_id), self._name, value)

    def __delitem__(self, req_id: str) -> None:
        self[req_id]                      # KeyError when absent, as a dict
        setattr(self._table[req_id], self._name, None)

    def __iter__(self) -> Iterator[str]:
        return (r for r in self._table if getattr(self._table[r], self._name) is not None)

    def __len__(self) -> int:
        return sum(1 for _ in self)
