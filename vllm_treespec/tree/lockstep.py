"""Lockstep tree building: many requests' trees, one batched drafter call per round.

An autoregressive draft model drafts the trees of all requests of an engine step. Built one
request at a time (``build_tree(builder, Expander(...), budget)``), every tree level costs one
model call per request; here the builders run side by side and each round's expansions of ALL
requests go to the drafter in ONE call:

1. ``builder_steps(builder, root, budget, **params)`` per request: the builder as a step
   generator (parameters checked at once, with the builder's own BuildError messages);
2. ``run_lockstep(generators, expand_batch)``: each round collects every unfinished generator's
   pending expansion, calls ``expand_batch`` once with all of them, cleans the answer exactly as
   ``Expander.expand`` does (`vllm_treespec.tree.candidates.clean_children`) and sends each
   generator its children; returns the trees, equal to the synchronous builders' trees.

Supported builders and what one round asks of a request:

==========  ================================================================================
static      one level: every node of the level (all paths of one depth), k = the level's fan-out
threshold   one level: every active leaf, k = branch
chain       one level: the chain's last node, k = 1
best_first  one node: the root, then each popped node whose children are not known yet (with
            greedy_spine, first each spine node), k = topk of the node's level; with
            ``prefetch=m`` also up to m-1 of the next heap nodes (same tree, fewer rounds)
==========  ================================================================================

so the number of ``expand_batch`` calls is the largest number of rounds over the requests (for
static/threshold/chain at most the tree depth; for best_first up to about the budget, or about
budget / m with prefetch). A request
that expands nothing (budget 0, max_depth 0, a drafter returning no children) finishes in the
round it runs out and never holds the others up. ``beam`` has no lockstep form yet.

expand_batch protocol
---------------------
``expand_batch(requests) -> results``, ``len(results) == len(requests)``, in the same order.

Each request is an `ExpandRequest`: a 3-tuple ``(index, paths, k)`` (so ``for i, paths, k in
requests`` works) with two extra attributes:

* ``index``: position of the generator in ``run_lockstep``'s list (= the engine request);
* ``paths``: non-empty list of token tuples after the root, ``()`` = the root itself;
* ``k``: how many children per path the builder wants (top-k);
* ``node_ids``: the builder's internal id of the node each path ends at;
* ``parent_ids``: the builder's internal id of each such node's parent (-1 for the root).

Builder ids number one request's tree nodes in CREATION order, root = 0: a node gets the next id
when the expansion of its parent returns it (children by rank). They are the builder's ``Nodes``
numbering, not the final DraftTree's indices in general: static, threshold and chain keep every
node they create in creation order (the ids ARE the tree indices), best_first outputs nodes in
pop order and drops nodes it created but never picked. A node is only ever expanded after its
parent was, so a drafter that keeps per-node state (K/V, a recurrent state) can key it by
builder id: expanding node ``v`` = run the token ``paths[i][-1]`` on top of ``parent_ids[i]``'s
state (the root's state is the committed context). Paths identify nodes just as well (siblings
carry distinct tokens), for a drafter that prefers them.

Each result is a pair ``(tokens, logprobs)`` for the request's paths: int token ids
``[len(paths), <= k]`` and their log-probs (same shape), numpy arrays, torch tensors (any
device) or nested lists. Rows may be padded with -1; per row, repeated tokens are dropped (first
kept) and the rest sorted by log-prob, highest first (ties keep the given order); log-probs of
kept tokens must be finite and <= 0 (else `CandidateError`). The same format as an `Expander`'s
``fn(paths, k)``.

For the draft-LM runtime (`vllm_treespec.drafters.lm.base.DraftLM`), whose ``extend`` numbers
nodes 1, 2, ... per request in call order: keep per request a map builder id -> runtime id
(root: 0 -> 0); a request expanding the root uses ``start_step``'s log-probs; any other node
``v`` is ``extend(req_index=index, parent=runtime[parent_ids[i]], token=paths[i][-1])`` in one
batched call for all requests' non-root nodes of the round, and ``runtime[v]`` = the id it gets.

Example:
    >>> import numpy as np
    >>> def expand_batch(requests):        # a toy drafter: children t+1 (p=.6) and t+2 (p=.3)
    ...     out = []
    ...     for index, paths, k in requests:
    ...         last = np.array([p[-1] if p else 10 * (index + 1) for p in paths])
    ...         toks = np.stack([last + 1, last + 2], axis=1)[:, :k]
    ...         out.append((toks, np.log(np.tile([.6, .3], (len(paths), 1)))[:, :k]))
    ...     return out
    >>> gens = [builder_steps("static", 10, 4, template=(2, 1)),
    ...         builder_steps("chain", 20, 3)]
    >>> [t.draft_token_ids() for t in run_lockstep(gens, expand_batch)]
    [[11, 12, 12, 13], [21, 22, 23]]
"""
from __future__ import annotations

from typing import Any, Callable, Generator, Sequence

import numpy as np

from vllm_treespec.tree.builders import BUILDERS, builder_params
from vllm_treespec.tree.builders._common import MAX_BUDGET, BuildError, Expansion, check_int
from vllm_treespec.tree.builders.best_first import best_first_steps
from vllm_treespec.tree.builders.chain import chain_steps
from vllm_treespec.tree.builders.static import static_steps
from vllm_treespec.tree.builders.threshold import threshold_steps
from vllm_treespec.tree.candidates import CandidateError, Expander, clean_children
from vllm_treespec.tree.draft_tree import DraftTree

__all__ = ["LOCKSTEP_BUILDERS", "Expansion", "ExpandRequest", "builder_steps", "run_lockstep"]

LOCKSTEP_BUILDERS: dict[str, Callable[..., Generator]] = {
    "best_first": best_first_steps,
    "chain": chain_steps,
    "static": static_steps,
    "threshold": threshold_steps,
}

RawChildren = Any  # (tokens [n_paths, <= k], logprobs [n_paths, <= k]), see the module docstring
ExpandBatch = Callable[[list["ExpandRequest"]], Sequence[RawChildren]]


class ExpandRequest(tuple):
    """``(index, paths, k)`` plus ``node_ids`` / ``parent_ids`` (builder ids, module docstring)."""

    def __new__(cls, index: int, paths: list[tuple[int, ...]], k: int, node_ids: list[int],
                parent_ids: list[int]) -> "ExpandRequest":
        self = super().__new__(cls, (index, paths, k))
        self.node_ids = node_ids
        self.parent_ids = parent_ids
        return self

    def __getnewargs__(self):
        return (*self, self.node_ids, self.parent_ids)

    @property
    def index(self) -> int:
        return self[0]

    @property
    def paths(self) -> list[tuple[int, ...]]:
        return self[1]

    @property
    def k(self) -> int:
        return self[2]

    def __repr__(self) -> str:
        return (f"ExpandRequest(index={self[0]}, paths={self[1]!r}, k={self[2]}, "
                f"node_ids={self.node_ids!r}, parent_ids={self.parent_ids!r})")


class _LockstepCandidates(Expander):
    """A request's root, context and n-gram signal; its children come from `run_lockstep`."""

    __slots__ = ()
    rho_owner = "builder_steps call"  # named in the "scorer needs an n-gram signal" error

    def __init__(self, root: int, context: Sequence[int], rho):
        super().__init__(_no_expand, root, context, rho)

    def expand(self, paths, k):
        _no_expand(paths, k)


def _no_expand(paths, k):
    raise RuntimeError("builder_steps generators yield their expansions (run_lockstep answers "
                       "them); they never call Expander.expand")


def builder_steps(builder: str, root: int, budget: int, *, context: Sequence[int] = (),
                  rho=None, **params: Any) -> Generator[Expansion, list, DraftTree]:
    """One request's tree builder as a step generator for `run_lockstep`.

    ``builder`` is one of `LOCKSTEP_BUILDERS`; ``params`` are that builder's keyword parameters
    (`builder_params(builder)`, the ranges an Expander allows), checked here with the same
    BuildError messages as ``build_tree(builder, Expander(fn, root, context, rho), budget,
    **params)``, whose tree the generator returns. ``root`` is the request's last sampled token;
    ``context`` (committed tokens before it) and ``rho`` (an n-gram signal) matter only to
    best_first scorers that read an n-gram signal (presto, dart).

    The generator yields `Expansion` (paths, k, node_ids, parent_ids) and must be sent the
    cleaned children of those paths (what ``Expander.expand(paths, k)`` returns); its return
    value (``StopIteration.value``) is the DraftTree.
    """
    steps = LOCKSTEP_BUILDERS.get(builder) if isinstance(builder, str) else None
    if steps is None:
        supported = ", ".join(sorted(LOCKSTEP_BUILDERS))
        if isinstance(builder, str) and builder in BUILDERS:
            raise BuildError(f"tree builder {builder!r} has no lockstep form; supported: "
                             f"{supported}")
        raise BuildError(f"unknown lockstep tree builder {builder!r}; supported: {supported}")
    allowed = builder_params(builder)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise BuildError(f"builder {builder!r}: unknown parameter(s) {unknown}; allowed: "
                         f"{', '.join(sorted(allowed))}")
    budget = check_int(builder, "budget", budget, 0, MAX_BUDGET)
    try:
        cand = _LockstepCandidates(root, context, rho)
    except CandidateError as e:
        raise BuildError(f"builder {builder!r}: {e}") from None
    return steps(cand, budget, **params)


def run_lockstep(generators: Sequence[Generator[Expansion, list, DraftTree]],
                 expand_batch: ExpandBatch, *, ordered: bool = False) -> list[DraftTree]:
    """Advance all step generators together; one ``expand_batch`` call per round.

    ``generators``: step generators (`builder_steps`, or any builder's ``*_steps``), fresh, one
    per request. Each round sends every unfinished generator the cleaned children of its pending
    expansion; ``expand_batch`` (format in the module docstring) is called once per round with
    the requests of all unfinished generators, in generator order, and never with an empty list.
    Returns each generator's DraftTree, in order. If anything raises, the unfinished generators
    are closed and the error propagates; a malformed result raises `CandidateError` naming the
    request. ``ordered``: children are passed on in the order ``expand_batch`` gave them instead
    of sorted by log-prob (for `vllm_treespec.tree.sampled` generators, whose children are draws
    in draw order; top-k rows that are already sorted reach the other builders unchanged).
    """
    gens = list(generators)
    trees: list[DraftTree | None] = [None] * len(gens)
    pending: list[tuple[int, Expansion]] = []

    def step(i: int, send) -> None:
        try:
            req = gens[i].send(send)
        except StopIteration as done:
            if not isinstance(done.value, DraftTree):
                raise TypeError(f"lockstep generator {i} returned {type(done.value).__name__}, "
                                f"not a DraftTree") from None
            trees[i] = done.value
            return
        if not isinstance(req, Expansion) or not req.paths:
            raise TypeError(f"lockstep generator {i} yielded {req!r}; expected an Expansion "
                            f"with at least one path")
        pending.append((i, req))

    try:
        for i in range(len(gens)):
            step(i, None)
        while pending:
            requests = [ExpandRequest(i, e.paths, e.k, e.node_ids, e.parent_ids)
                        for i, e in pending]
            raw = expand_batch(requests)
            if raw is None or len(raw) != len(requests):
                raise CandidateError(
                    f"expand_batch returned {'None' if raw is None else len(raw)} results for "
                    f"{len(requests)} requests")
            answers = [_clean(r, res, ordered) for r, res in zip(requests, raw)]
            pending.clear()
            for r, kids in zip(requests, answers):
                step(r.index, kids)
    except BaseException:
        for i, g in enumerate(gens):
            if trees[i] is None:
                g.close()
        raise
    return trees  # type: ignore[return-value]


def _clean(req: ExpandRequest, res, ordered: bool) -> list[tuple[np.ndarray, np.ndarray]]:
    try:
        tokens, logprobs = res
    except (TypeError, ValueError):
        raise CandidateError(f"expand_batch result for request {req.index} must be a (tokens, "
                             f"logprobs) pair, got {type(res).__name__}") from None
    try:
        return clean_children(tokens, logprobs, len(req.paths), req.k, keep_order=ordered)
    except CandidateError as e:
        raise CandidateError(f"expand_batch result for request {req.index}: {e}") from None
