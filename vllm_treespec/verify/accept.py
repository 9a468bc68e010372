"""Lossless tree acceptance: which draft path a request keeps and which token follows it.

The walk is batched over requests and loops over tree levels only: at each level every still
active request looks at its current node u (starting at the root), picks a token x, emits it, and
descends if x is one of u's children; otherwise x is the correction/bonus token and the request
stops. Target rows are processed (temperature, min-p, top-k, top-p) only for visited nodes.

Modes, for requests with temperature >= 1e-5 (requests below it are always greedy):

- ``greedy``: x = argmax of u's row, for every request whatever its temperature.
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

from dataclasses import dataclass
from typing import Any, Callable, Literal

import torch

from vllm_treespec.verify.coins import ACCEPT_COIN, DRAW_COIN, Generators, draw_coins
from vllm_treespec.verify.rrs_inputs import check_draft_probs, check_node_draws, check_num_draws
from vllm_treespec.verify.rules import find_child, recursive_rejection, sample_categorical
from vllm_treespec.verify.sampling_params import (
    SamplingParamsBatch,
    greedy_tokens,
    process_logits,
)
from vllm_treespec.verify.tree_input import TreeLayout, build_layout, unpack_tree

Mode = Literal["greedy", "target_only", "rrs"]
MODES: tuple[str, ...] = ("greedy", "target_only", "rrs")


@dataclass(frozen=True)
class AcceptResult:
    """Outcome per request; widths are W = max tree depth in the batch + 1 (or ``max_depth`` + 1).

    emitted: int64 [B, W], accepted path tokens then the bonus/correction token, -1 padded
        (the layout vLLM's scheduler expects from the rejection sampler).
    num_emitted: int64 [B], >= 1.
    accepted_nodes: int64 [B, W], local node indices of the accepted path without the root,
        -1 padded (the last column is always -1).
    accepted_rows: int64 [B, W], the same nodes as flat row indices into the tree batch.
    """

    emitted: torch.Tensor
    num_emitted: torch.Tensor
    accepted_nodes: torch.Tensor
    accepted_rows: torch.Tensor

    @property
    def num_accepted(self) -> torch.Tensor:
        """Accepted draft tokens per request (emitted minus the bonus/correction token)."""
        return self.num_emitted - 1


def _request_params(mode: Mode, sampling: SamplingParamsBatch | None, num_requests: int,
                    device: torch.device) -> tuple[SamplingParamsBatch | None, torch.Tensor]:
    """(validated sampling parameters or None in greedy mode, bool [B] greedy requests)."""
    if mode == "greedy":
        return None, torch.ones(num_requests, dtype=torch.bool, device=device)
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


def _root_only_offsets(fields: tuple[torch.Tensor, ...], device: torch.device) -> torch.Tensor | None:
    """The offsets of a valid batch of root-only trees (no drafts anywhere: every request owns
    one row, its root), else None (build_layout then validates and reports any error). `fields`:
    unpack_tree's (offsets, tokens, parents, depth)."""
    offsets, tokens, parents, depth = fields
    num_requests = offsets.numel() - 1
    if num_requests < 1 or tokens.numel() != num_requests or parents.numel() != num_requests:
        return None
    if not bool((offsets == torch.arange(num_requests + 1, device=device)).all()):
        return None
    if bool((parents != -1).any()) or (depth is not None and (depth.numel() != num_requests
                                                              or bool((depth != 0).any()))):
        return None
    return offsets


def _accept_roots(offsets: torch.Tensor, logits: torch.Tensor, mode: Mode,
                  sampling: SamplingParamsBatch | None, generators: Generators,
                  max_depth: int | None, coin_rows: int | None) -> AcceptResult:
    """accept() for root-only trees (a step in which no request drafted): the walk's first level
    and nothing else, with the same coin block (two per node), processing and draw coin, so its
    tokens and generator states are the walk's to the bit, in any mode; it skips the layout and
    the per-level bookkeeping, which cost more than the draw."""
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
    params, is_greedy = _request_params(mode, sampling, num_requests, device)
    coins = _coins(offsets, torch.arange(num_requests, device=device), generators, is_greedy,
                   coin_rows)
    picked = torch.empty(num_requests, dtype=torch.int64, device=device)
    g = is_greedy.nonzero().squeeze(1)
    if g.numel():
        picked[g] = greedy_tokens(logits[g])
    s = (~is_greedy).nonzero().squeeze(1)
    if s.numel():
        assert params is not None and coins is not None
        probs = torch.softmax(process_logits(logits[s], params.rows(s), inplace=True),
                              dim=-1, dtype=torch.float32).to(torch.float64)
        picked[s] = sample_categorical(probs, coins[s, DRAW_COIN])
    emitted = torch.full((num_requests, width), -1, dtype=torch.int64, device=device)
    emitted[:, 0] = picked
    nodes = torch.full((num_requests, width), -1, dtype=torch.int64, device=device)
    return AcceptResult(emitted, torch.ones(num_requests, dtype=torch.int64, device=device),
                        nodes, nodes.clone())


def _unpack(tree: Any, logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The tree's flat fields on the logits' device, after checking the logits."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError("logits must be a 2-D tensor [T, V]")
    if not logits.dtype.is_floating_point:
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    return unpack_tree(tree, logits.device)


def _layout_for(fields: tuple[torch.Tensor, ...], logits: torch.Tensor,
                max_depth: int | None) -> tuple[TreeLayout, int]:
    """(layout, output width) with the logits rows and max_depth checked against the trees."""
    layout = build_layout(fields, logits.shape[1], logits.device)
    if logits.shape[0] != layout.num_rows:
        raise ValueError(
            f"logits has {logits.shape[0]} rows but the tree batch has {layout.num_rows} nodes; "
            "pass the target logits at every node row"
        )
    width = layout.max_depth + 1
    if max_depth is not None:
        if max_depth < layout.max_depth:
            raise ValueError(
                f"max_depth={max_depth} is smaller than the deepest node ({layout.max_depth})"
            )
        width = max_depth + 1
    return layout, width


LOOKUP = -2   # a sampled pick whose child the walk finds by token match
# A rule's pick at the sampled rows of one level: (rows [n], target probs float64 [n, V]) ->
# (tokens [n], child rows [n]: a flat row, -1 to stop there, LOOKUP to match the token)
SampledPick = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor]]


def _walk(layout: TreeLayout, logits: torch.Tensor, width: int, is_greedy: torch.Tensor,
          params: SamplingParamsBatch | None, pick_sampled: SampledPick | None) -> AcceptResult:
    """The one downward walk every rule shares: level by level, each active request picks a
    token at its current node (argmax for greedy requests, the rule's `pick_sampled` for the
    others, on target rows processed only where visited), emits it and descends into the child
    it names or the child holding that token; a request without such a child stops."""
    device = logits.device
    num_requests = layout.num_requests
    emitted = torch.full((num_requests, width), -1, dtype=torch.int64, device=device)
    nodes = torch.full((num_requests, width), -1, dtype=torch.int64, device=device)
    num_emitted = torch.zeros(num_requests, dtype=torch.int64, device=device)
    cur = layout.offsets[:-1].clone()
    active = torch.arange(num_requests, device=device)
    for level in range(width):
        if active.numel() == 0:
            break
        rows = cur[active]
        picked = torch.empty_like(rows)
        chosen = torch.full_like(rows, LOOKUP)
        greedy_here = is_greedy[active]
        g = greedy_here.nonzero().squeeze(1)
        if g.numel():
            picked[g] = greedy_tokens(logits[rows[g]])
        s = (~greedy_here).nonzero().squeeze(1)
        if s.numel():
            assert params is not None and pick_sampled is not None
            srows = rows[s]
            probs = torch.softmax(
                process_logits(logits[srows], params.rows(layout.request_of_row[srows]),
                               inplace=True),
                dim=-1, dtype=torch.float32).to(torch.float64)
            picked[s], chosen[s] = pick_sampled(srows, probs)
        lookup = chosen == LOOKUP
        if bool(lookup.any()):
            li = lookup.nonzero().squeeze(1)
            chosen[li] = find_child(layout.children, layout.tokens, rows[li], picked[li])
        emitted[active, level] = picked
        num_emitted[active] += 1
        go = chosen >= 0
        movers, nxt = active[go], chosen[go]
        nodes[movers, level] = nxt - layout.offsets[movers]
        cur[movers] = nxt
        active = movers
    base = layout.offsets[:-1].unsqueeze(1)
    accepted_rows = torch.where(nodes >= 0, nodes + base, -1)
    return AcceptResult(emitted, num_emitted, nodes, accepted_rows)


def accept_greedy(tree: Any, logits: torch.Tensor, max_depth: int | None = None) -> AcceptResult:
    """Greedy rule: at every node the argmax of its row, for every request whatever its
    temperature (the torch reference of csrc/verify/greedy_walk.cpp and vllm_treespec/kernels/tree_accept.py).

    tree: flat tree batch (tree_input.py); logits: float [T, V] at every node row; max_depth:
    pad outputs to max_depth + 1 columns (>= the deepest node)."""
    fields = _unpack(tree, logits)
    roots = _root_only_offsets(fields, logits.device)
    if roots is not None:
        return _accept_roots(roots, logits, "greedy", None, None, max_depth, None)
    layout, width = _layout_for(fields, logits, max_depth)
    _, is_greedy = _request_params("greedy", None, layout.num_requests, logits.device)
    return _walk(layout, logits, width, is_greedy, None, None)


def accept_target_only(tree: Any, logits: torch.Tensor,
                       sampling: SamplingParamsBatch | None = None,
                       generators: Generators = None, max_depth: int | None = None,
                       coin_rows: int | None = None) -> AcceptResult:
    """Target-only rule (module docstring): x ~ p_u at each node, for candidate sets fixed before
    this step's coins; requests with temperature < 1e-5 take the argmax.

    sampling: per-request temperature/top-k/top-p/min-p (None = temperature 1, no filters);
    generators: None, one torch.Generator, or one per request; coin_rows: coin rows per seeded
    request per call (coins.py)."""
    fields = _unpack(tree, logits)
    roots = _root_only_offsets(fields, logits.device)
    if roots is not None:
        return _accept_roots(roots, logits, "target_only", sampling, generators, max_depth,
                             coin_rows)
    layout, width = _layout_for(fields, logits, max_depth)
    params, is_greedy = _request_params("target_only", sampling, layout.num_requests,
                                        logits.device)
    coins = _coins(layout.offsets, layout.request_of_row, generators, is_greedy, coin_rows)

    def pick(srows: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert coins is not None
        picked = sample_categorical(probs, coins[srows, DRAW_COIN])
        return picked, torch.full_like(picked, LOOKUP)

    return _walk(layout, logits, width, is_greedy, params, pick)


def accept_rrs(tree: Any, logits: torch.Tensor, draft_probs: torch.Tensor, replacement: bool,
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
    fields = _unpack(tree, logits)
    device = logits.device
    layout, width = _layout_for(fields, logits, max_depth)
    params, is_greedy = _request_params("rrs", sampling, layout.num_requests, device)
    q_all, q_index = check_draft_probs(draft_probs, draft_rows, layout, logits.shape[1], device,
                                       full=validate)
    draws = check_num_draws(num_draws, replacement, layout, device)
    if replacement:
        check_node_draws(node_draws, draws, q_index, layout, device)
    elif node_draws is not None:
        raise ValueError("node_draws is only used by mode='rrs' with replacement=True")
    coins = _coins(layout.offsets, layout.request_of_row, generators, is_greedy, coin_rows)

    def pick(srows: torch.Tensor, probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        assert coins is not None
        picked = torch.empty_like(srows)
        chosen = torch.full_like(srows, LOOKUP)
        has_q = q_index[srows] >= 0
        t = (~has_q).nonzero().squeeze(1)
        if t.numel():           # no q row: the target-only rule
            picked[t] = sample_categorical(probs[t], coins[srows[t], DRAW_COIN])
        r = has_q.nonzero().squeeze(1)
        if r.numel():
            rrows = srows[r]
            rp = probs[r] if t.numel() else probs
            rp /= rp.sum(dim=1, keepdim=True)  # ratios need an exact distribution
            child, residual = recursive_rejection(
                rp, q_all[q_index[rrows]].to(torch.float64), layout.children[rrows],
                layout.tokens, coins[:, ACCEPT_COIN], replacement, draws)
            correction = sample_categorical(residual, coins[rrows, DRAW_COIN])
            picked[r] = torch.where(child >= 0, layout.tokens[child.clamp(min=0)], correction)
            chosen[r] = child     # a correction ends the walk even if it equals a child
        return picked, chosen

    return _walk(layout, logits, width, is_greedy, params, pick)


def accept(tree: Any, logits: torch.Tensor, mode: Mode = "greedy", **options: Any) -> AcceptResult:
    """One of the three rules by name ("greedy", "target_only", "rrs"; module docstring), with
    that rule's keyword options (`accept_greedy`, `accept_target_only`, `accept_rrs`); an option
    another rule owns is an error naming the rule it belongs to.

    Example::

        tree = (torch.tensor([0, 3]), torch.tensor([7, 1, 2]), torch.tensor([-1, 0, 0]))
        res = accept(tree, torch.randn(3, 8), mode="target_only",
                     sampling=SamplingParamsBatch.from_lists([0.8]),
                     generators=[torch.Generator().manual_seed(0)])
        res.emitted[0, : res.num_emitted[0]]  # tokens to append
    """
    if mode not in MODES:
        raise ValueError(f"unknown acceptance mode {mode!r}; expected one of {MODES}")
    rrs_only = {"draft_probs", "draft_rows", "replacement", "num_draws", "node_draws", "validate"}
    if mode != "rrs":
        misplaced = sorted(k for k, v in options.items()
                           if k in rrs_only - {"validate"} and v is not None)
        if misplaced:
            verb = "is" if len(misplaced) == 1 else "are"
            raise ValueError(f"{' and '.join(misplaced)} {verb} only used by mode='rrs'"
                             + (" with replacement=True" if set(misplaced) <= {"num_draws", "node_draws"}
                                else ""))
        options = {k: v for k, v in options.items() if k not in rrs_only}
    if mode == "greedy":
        options = {k: v for k, v in options.items()
                   if k not in ("sampling", "generators", "coin_rows")}
        return accept_greedy(tree, logits, **options)
    if mode == "target_only":
        return accept_target_only(tree, logits, **options)
    options.setdefault("draft_probs", None)
    options.setdefault("replacement", None)
    return accept_rrs(tree, logits, **options)
