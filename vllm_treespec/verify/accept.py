"""Lossless sampled tree acceptance: which draft path a request keeps and which token follows it.

The walk is batched over requests and loops over tree levels only: at each level every still
active request looks at its current node u (starting at the root), picks a token x, emits it, and
descends if x is one of u's children; otherwise x is the correction/bonus token and the request
stops. Target rows are processed (temperature, min-p, top-k, top-p) only for visited nodes.

Greedy acceptance (argmax at every node) is greedy.py: a C++ walk on the host, a Triton walk on
CUDA. Requests below temperature 1e-5 in a sampled batch are handed to it, so the greedy rule has
one implementation per device and outputs equal to decoding without speculation.

Modes, for requests with temperature >= 1e-5:

- ``target_only``: for candidate sets fixed before sampling (top-k trees, any tree built without
  looking at this step's coins). x ~ p_u directly. Trying siblings in order with probability
  p(c_i) / (1 - p(c_1) - ... - p(c_{i-1})) and drawing the correction from p restricted to the
  non-children gives P(x) = p_u(x) for every x, i.e. the same law as one draw from p_u; the draw
  is just cheaper (one coin per level) and needs no sibling loop. Emitted tokens are therefore
  autoregressive samples from the target, for any tree whose shape does not depend on the coins.
- ``rrs``: drafts sampled from the drafter's q (row u of ``draft_probs`` = the q u's children were
  drawn from), recursive rejection sampling as in SpecInfer (``replacement=True``, i.i.d. draws)
  or Sequoia (``replacement=False``, draws without replacement). Children must be in draw order.
  Lossless only when the children are the drafter's draws; never use it on deterministic top-k
  children. Without replacement a tree may be cut to a prefix of its node list (the engine's
  scheduler does): each node then keeps its first k draws, k fixed by the other nodes, which is
  lossless. With replacement it may not: repeats are merged into one sibling standing for
  ``num_draws`` draws, and a cut keeps the draws before the first draw of a NEW token, a set
  chosen by the values of the draws themselves: the kept draws are no longer i.i.d. from q and
  the emitted law is biased (tests/test_verify_lossless.py shows it). So ``replacement=True``
  needs ``node_draws`` (the draws each node made) and rejects a tree whose children do not
  account for all of them, which is what a cut leaves.
  With ``draft_rows`` (compact form), ``draft_probs`` holds only the rows that exist and
  ``draft_rows[u]`` says which one is u's (-1 = none): a node without a q row is verified with
  the target-only rule, which is exact for any children not chosen with this step's coins. So
  one call serves a batch mixing sampled drafts (rrs) and top-k drafts (target-only), node by
  node, and the engine never materialises q rows for leaves or top-k trees.

Coins: one block per sampled request per call, two coins per node in every mode (coins.py):
column 0 decides the node's acceptance in ``rrs``, column 1 draws the token sampled at the node
(target-only rule, rrs correction, root-only path). A request's tokens and the state its
generator is left in therefore depend on its own tree, sampling parameters and generator only,
not on the mode its batch needs nor on its neighbours.
"""
from __future__ import annotations

from typing import Any, Callable, Literal

import numpy as np
import torch

from vllm_treespec.native import native
from vllm_treespec.verify.coins import ACCEPT_COIN, DRAW_COIN, Generators, draw_coins
from vllm_treespec.verify.greedy import greedy_walk
from vllm_treespec.verify.result import AcceptResult
from vllm_treespec.verify.rrs_inputs import check_draft_probs, check_node_draws, check_num_draws
from vllm_treespec.verify.rules import (
    draw_target_tokens,
    find_child,
    native_row_inputs,
    recursive_rejection,
    sample_categorical,
)
from vllm_treespec.verify.sampling_params import (
    SAMPLING_EPS,
    SamplingParamsBatch,
    greedy_tokens,
    process_logits,
)
from vllm_treespec.tree.batch import TreeBatch

Mode = Literal["target_only", "rrs"]
MODES: tuple[str, ...] = ("target_only", "rrs")

__all__ = ["MODES", "AcceptResult", "accept", "accept_rrs", "accept_target_only"]


def _request_params(sampling: SamplingParamsBatch | None, num_requests: int,
                    device: torch.device) -> tuple[SamplingParamsBatch, torch.Tensor]:
    """(validated sampling parameters, bool [B] greedy requests)."""
    if sampling is None:
        sampling = SamplingParamsBatch.random(num_requests)
    params = sampling.validated(num_requests, device)
    return params, params.is_greedy


def _coins(offsets: torch.Tensor, request_of_row: torch.Tensor, generators: Generators,
           is_greedy: torch.Tensor, coin_rows: int | None) -> torch.Tensor | None:
    """Every sampled request's coin block, the same layout in every mode (coins.py); None when
    all requests are greedy, after checking that a generator list still has one entry per
    request."""
    if not bool(is_greedy.all()):
        return draw_coins(offsets, request_of_row, generators, is_greedy, coin_rows)
    num_requests = offsets.numel() - 1
    if generators is not None and not isinstance(generators, torch.Generator):
        if len(generators) != num_requests:
            raise ValueError(
                f"generators has {len(generators)} entries but the batch has {num_requests} "
                "requests"
            )
    return None


def _accept_roots(offsets: torch.Tensor, logits: torch.Tensor,
                  sampling: SamplingParamsBatch | None, generators: Generators,
                  max_depth: int | None, coin_rows: int | None) -> AcceptResult:
    """accept() for root-only trees (a step in which no request drafted): the walk's first level
    and nothing else, with the same coin block (two per node), processing and draw coin, so its
    tokens and generator states are the walk's to the bit, in any mode; it skips the layout and
    the per-level bookkeeping, which cost more than the draw. A greedy request's token is the
    greedy walk's on a root-only tree: its root's argmax (`greedy_tokens`, the walk's argmax)."""
    device = logits.device
    num_requests = offsets.numel() - 1
    if logits.shape[0] != num_requests:
        raise ValueError(
            f"logits has {logits.shape[0]} rows but the tree batch has {num_requests} nodes; "
            "pass the target logits at every node row"
        )
    if max_depth is not None and max_depth < 0:
        raise ValueError(f"max_depth={max_depth} is smaller than the deepest node (0)")
    width = 1 if max_depth is None else max_depth + 1
    params, is_greedy = _request_params(sampling, num_requests, device)
    coins = _coins(offsets, torch.arange(num_requests, device=device), generators, is_greedy,
                   coin_rows)
    picked = torch.empty(num_requests, dtype=torch.int64, device=device)
    g = is_greedy.nonzero().squeeze(1)
    if g.numel():
        picked[g] = greedy_tokens(logits[g])
    s = (~is_greedy).nonzero().squeeze(1)
    if s.numel():
        assert coins is not None
        picked[s] = draw_target_tokens(logits[s], params.rows(s), coins[s, DRAW_COIN])
    emitted = torch.full((num_requests, width), -1, dtype=torch.int64, device=device)
    emitted[:, 0] = picked
    nodes = torch.full((num_requests, width), -1, dtype=torch.int64, device=device)
    return AcceptResult(emitted, torch.ones(num_requests, dtype=torch.int64, device=device),
                        nodes, nodes.clone())


def _on_logits_device(batch: TreeBatch, logits: torch.Tensor) -> TreeBatch:
    """The batch on the logits' device (its twin there), after checking the logits."""
    if not isinstance(batch, TreeBatch):
        raise TypeError(f"acceptance takes a TreeBatch (vllm_treespec.tree.TreeBatch.from_trees or "
                        f".from_arrays), got {type(batch).__name__}")
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError("logits must be a 2-D tensor [T, V]")
    if not logits.dtype.is_floating_point:
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    return batch.to(logits.device)


def _checked(batch: TreeBatch, logits: torch.Tensor, max_depth: int | None) -> int:
    """The output width, after checking the batch's contract and the logits rows and max_depth
    against it."""
    batch.check(logits.shape[1])
    if logits.shape[0] != batch.num_rows:
        raise ValueError(
            f"logits has {logits.shape[0]} rows but the tree batch has {batch.num_rows} nodes; "
            "pass the target logits at every node row"
        )
    width = batch.max_depth + 1
    if max_depth is not None:
        if max_depth < batch.max_depth:
            raise ValueError(
                f"max_depth={max_depth} is smaller than the deepest node ({batch.max_depth})"
            )
        width = max_depth + 1
    return width


LOOKUP = -2   # a sampled pick whose child the walk finds by token match
# A rule's pick at the sampled rows of one level: (rows [n], target probs float64 [n, V]) ->
# (tokens [n], child rows [n]: a flat row, -1 to stop there, LOOKUP to match the token)
SampledPick = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _greedy_requests(batch: TreeBatch, logits: torch.Tensor, width: int,
                     is_greedy: torch.Tensor) -> tuple[torch.Tensor, AcceptResult]:
    """(batch indices, result) of the greedy requests of a sampled batch, decided by the greedy
    walk (greedy.py: C++ on the host, Triton on CUDA) over their own trees."""
    reqs = is_greedy.nonzero().squeeze(1)
    rows = is_greedy[batch.request_of_row]
    sub_offsets = torch.zeros(reqs.numel() + 1, dtype=torch.int64, device=batch.device)
    torch.cumsum(batch.sizes[reqs], dim=0, out=sub_offsets[1:])
    greedy = TreeBatch(sub_offsets, batch.tokens[rows], batch.parents[rows], batch.depth[rows])
    return reqs, greedy_walk(greedy, logits, width, rows.nonzero().squeeze(1))


def _walk(batch: TreeBatch, logits: torch.Tensor, width: int, is_greedy: torch.Tensor,
          params: SamplingParamsBatch, pick_sampled: SampledPick) -> AcceptResult:
    """The one downward walk the sampled rules share: level by level, each active request picks
    a token at its current node with the rule's `pick_sampled`, on target rows processed only
    where visited, emits it and descends into the child it names or the child holding that
    token; a request without such a child stops. Greedy requests (temperature < 1e-5) take the
    greedy walk instead (`_greedy_requests`); they draw no coins, so nothing else changes."""
    device = logits.device
    num_requests = batch.batch_size
    emitted = torch.full((num_requests, width), -1, dtype=torch.int64, device=device)
    nodes = torch.full((num_requests, width), -1, dtype=torch.int64, device=device)
    num_emitted = torch.zeros(num_requests, dtype=torch.int64, device=device)
    if bool(is_greedy.any()):
        g, greedy = _greedy_requests(batch, logits, width, is_greedy)
        emitted[g], nodes[g], num_emitted[g] = (greedy.emitted, greedy.accepted_nodes,
                                                greedy.num_emitted)
    cur = batch.offsets[:-1].clone()
    active = (~is_greedy).nonzero().squeeze(1)
    for level in range(width):
        if active.numel() == 0:
            break
        rows = cur[active]
        probs = torch.softmax(
            process_logits(logits[rows], params.rows(batch.request_of_row[rows]), inplace=True),
            dim=-1, dtype=torch.float32).to(torch.float64)
        picked, chosen = pick_sampled(rows, probs)
        lookup = chosen == LOOKUP
        if bool(lookup.any()):
            li = lookup.nonzero().squeeze(1)
            chosen[li] = find_child(batch.children, batch.tokens, rows[li], picked[li])
        emitted[active, level] = picked
        num_emitted[active] += 1
        go = chosen >= 0
        movers, nxt = active[go], chosen[go]
        nodes[movers, level] = nxt - batch.offsets[movers]
        cur[movers] = nxt
        active = movers
    return AcceptResult.from_paths(batch.offsets, emitted, num_emitted, nodes)


def accept_target_only(batch: TreeBatch, logits: torch.Tensor,
                       sampling: SamplingParamsBatch | None = None,
                       generators: Generators = None, max_depth: int | None = None,
                       coin_rows: int | None = None) -> AcceptResult:
    """Target-only rule (module docstring): x ~ p_u at each node, for candidate sets fixed before
    this step's coins; requests with temperature < 1e-5 take the argmax.

    sampling: per-request temperature/top-k/top-p/min-p (None = temperature 1, no filters);
    generators: None, one torch.Generator, or one per request; coin_rows: coin rows per seeded
    request per call (coins.py). On the host one native walk (`_target_only_native`), on a
    device the torch walk (`_target_only_torch`); both draw with `rules.draw_target_tokens`'s
    rule from the same coins."""
    batch = _on_logits_device(batch, logits)
    walk = _target_only_native if logits.device.type == "cpu" else _target_only_torch
    return walk(batch, logits, sampling, generators, max_depth, coin_rows)


def _target_only_torch(batch: TreeBatch, logits: torch.Tensor,
                       sampling: SamplingParamsBatch | None, generators: Generators,
                       max_depth: int | None, coin_rows: int | None) -> AcceptResult:
    """accept_target_only as the shared torch walk: for logits on a device, and the reference
    the native walk is tested against."""
    if batch.is_root_only:
        return _accept_roots(batch.offsets, logits, sampling, generators, max_depth, coin_rows)
    width = _checked(batch, logits, max_depth)
    params, is_greedy = _request_params(sampling, batch.batch_size, logits.device)
    coins = _coins(batch.offsets, batch.request_of_row, generators, is_greedy, coin_rows)

    def pick(srows: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert coins is not None
        picked = sample_categorical(probs, coins[srows, DRAW_COIN])
        return picked, torch.full_like(picked, LOOKUP)

    return _walk(batch, logits, width, is_greedy, params, pick)


def _target_only_native(batch: TreeBatch, logits: torch.Tensor,
                        sampling: SamplingParamsBatch | None, generators: Generators,
                        max_depth: int | None, coin_rows: int | None) -> AcceptResult:
    """accept_target_only on the host: coins drawn as in every mode (coins.py), then one native
    walk over the sampled requests (csrc/verify/sampled_walk.cpp) in place of the layout pass and
    the per-level torch ops (~0.9 ms a step at vocab 4096), and the greedy walk for the greedy
    ones. The native walk checks trees and parameters itself; when it refuses them, the torch
    checks run to name the problem in full."""
    offsets = batch.offsets
    num_requests = batch.batch_size
    params = sampling if sampling is not None else SamplingParamsBatch.random(max(num_requests, 0))
    try:
        if max_depth is not None and max_depth < 0:       # the native walk reads -1 as "deepest"
            raise ValueError(f"max_depth={max_depth}")
        request_of_row = batch.request_of_row
        logits_rows, temperature, top_k = native_row_inputs(logits, params, request_of_row)
        is_greedy = torch.from_numpy(temperature) < SAMPLING_EPS
        coins = _coins(offsets, request_of_row, generators, is_greedy, coin_rows)
        draw = coins[:, DRAW_COIN].contiguous().numpy() if coins is not None else np.zeros(0)
        emitted, nodes, count = native().target_only_tree_walk(
            logits_rows, offsets.numpy(), batch.tokens.numpy(), batch.parents.numpy(),
            batch.depth.numpy(), temperature, top_k,
            draw, -1 if max_depth is None else max_depth)
    except (ValueError, TypeError, RuntimeError):
        _checked(batch, logits, max_depth)                   # the torch checks, in their order,
        _request_params(sampling, num_requests, logits.device)   # name the problem in full
        raise
    emitted, nodes, count = (torch.from_numpy(x) for x in (emitted, nodes, count))
    if bool(is_greedy.any()):
        g, greedy = _greedy_requests(batch, logits, emitted.shape[1], is_greedy)
        emitted[g], nodes[g], count[g] = greedy.emitted, greedy.accepted_nodes, greedy.num_emitted
    return AcceptResult.from_paths(offsets, emitted, count, nodes)


def accept_rrs(batch: TreeBatch, logits: torch.Tensor, draft_probs: torch.Tensor, replacement: bool,
               sampling: SamplingParamsBatch | None = None, generators: Generators = None,
               draft_rows: torch.Tensor | None = None, num_draws: torch.Tensor | None = None,
               node_draws: torch.Tensor | None = None, max_depth: int | None = None,
               validate: bool = True, coin_rows: int | None = None) -> AcceptResult:
    """Recursive rejection sampling (module docstring) for children drawn from the drafter's q:
    nodes with a q row accept a child with the SpecInfer/Sequoia ratio and otherwise draw the
    correction from the residual; nodes without one use the target-only rule; requests with
    temperature < 1e-5 take the argmax.

    draft_probs: float [T, V] (or [M, V] with ``draft_rows`` int64 [T], -1 = no q row);
    replacement: children drawn i.i.d. (True; then ``node_draws`` [T] is required and
    ``num_draws`` [T] says how many draws a merged node stands for) or without replacement;
    validate: check that q rows with children are distributions (one O(T*V) pass)."""
    if replacement is None:
        raise ValueError(
            "mode='rrs' needs replacement=True (children drawn i.i.d. from q) or False "
            "(drawn without replacement); the rule that is lossless depends on it"
        )
    batch = _on_logits_device(batch, logits)
    device = logits.device
    width = _checked(batch, logits, max_depth)
    params, is_greedy = _request_params(sampling, batch.batch_size, device)
    q_all, q_index = check_draft_probs(draft_probs, draft_rows, batch, logits.shape[1], device,
                                       full=validate)
    draws = check_num_draws(num_draws, replacement, batch, device)
    if replacement:
        check_node_draws(node_draws, draws, q_index, batch, device)
    elif node_draws is not None:
        raise ValueError("node_draws is only used by mode='rrs' with replacement=True")
    coins = _coins(batch.offsets, batch.request_of_row, generators, is_greedy, coin_rows)

    def pick(srows: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert coins is not None
        picked = torch.empty_like(srows)
        chosen = torch.full_like(srows, LOOKUP)
        has_q = q_index[srows] >= 0
        t = (~has_q).nonzero().squeeze(1)
        if t.numel():           # no q row: the target-only rule, drawn as every walk draws it
            trows = srows[t]
            picked[t] = draw_target_tokens(logits[trows], params.rows(batch.request_of_row[trows]),
                                           coins[trows, DRAW_COIN], probs=probs[t])
        r = has_q.nonzero().squeeze(1)
        if r.numel():
            rrows = srows[r]
            rp = probs[r] if t.numel() else probs
            rp /= rp.sum(dim=1, keepdim=True)  # ratios need an exact distribution
            child, residual = recursive_rejection(
                rp, q_all[q_index[rrows]].to(torch.float64), batch.children[rrows],
                batch.tokens, coins[:, ACCEPT_COIN], replacement, draws)
            correction = sample_categorical(residual, coins[rrows, DRAW_COIN])
            picked[r] = torch.where(child >= 0, batch.tokens[child.clamp(min=0)], correction)
            chosen[r] = child     # a correction ends the walk even if it equals a child
        return picked, chosen

    return _walk(batch, logits, width, is_greedy, params, pick)


def accept(batch: TreeBatch, logits: torch.Tensor, mode: Mode = "target_only",
           **options: Any) -> AcceptResult:
    """One of the sampled rules by name ("target_only", "rrs"; module docstring), with that
    rule's keyword options (`accept_target_only`, `accept_rrs`); an option the other rule owns
    is an error naming the rule it belongs to. Greedy acceptance is `greedy.greedy_walk`.

    Example::

        tree = TreeBatch.from_arrays([0, 3], [7, 1, 2], [-1, 0, 0])
        res = accept(tree, torch.randn(3, 8), mode="target_only",
                     sampling=SamplingParamsBatch.from_lists([0.8]),
                     generators=[torch.Generator().manual_seed(0)])
        res.emitted[0, : res.num_emitted[0]]  # tokens to append
    """
    if mode not in MODES:
        hint = "; greedy acceptance is verify.greedy.greedy_walk" if mode == "greedy" else ""
        raise ValueError(f"unknown acceptance mode {mode!r}; expected one of {MODES}{hint}")
    rrs_only = {"draft_probs", "draft_rows", "replacement", "num_draws", "node_draws", "validate"}
    if mode == "target_only":
        misplaced = sorted(k for k, v in options.items()
                           if k in rrs_only - {"validate"} and v is not None)
        if misplaced:
            verb = "is" if len(misplaced) == 1 else "are"
            raise ValueError(f"{' and '.join(misplaced)} {verb} only used by mode='rrs'"
                             + (" with replacement=True" if set(misplaced) <= {"num_draws", "node_draws"}
                                else ""))
        options = {k: v for k, v in options.items() if k not in rrs_only}
        return accept_target_only(batch, logits, **options)
    options.setdefault("draft_probs", None)
    options.setdefault("replacement", None)
    return accept_rrs(batch, logits, **options)
