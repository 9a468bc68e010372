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
from typing import Any, Literal

import torch

from vllm_treespec.verify.coins import ACCEPT_COIN, DRAW_COIN, Generators, draw_coins
from vllm_treespec.verify.rules import find_child, recursive_rejection, sample_categorical
from vllm_treespec.verify.sampling_params import (
    SamplingParamsBatch,
    greedy_tokens,
    process_logits,
)
from vllm_treespec.verify.tree_input import TreeLayout, build_layout, unpack_tree

Mode = Literal["greedy", "target_only", "rrs"]
MODES: tuple[str, ...] = ("greedy", "target_only", "rrs")
PROB_SUM_TOL = 1e-3  # tolerance on draft rows summing to 1 (float32 softmax over ~1e5 entries)


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


def _first(mask: torch.Tensor) -> int:
    return int(mask.nonzero()[0, 0])


def _check_draft_rows(draft_rows: Any, num_q: int, layout: TreeLayout,
                      device: torch.device) -> torch.Tensor:
    """int64 [T]: each tree row's q row (compact form) or -1; identity for the full form."""
    if draft_rows is None:
        return torch.arange(layout.num_rows, device=device)
    idx = torch.as_tensor(draft_rows, device=device)
    if idx.shape != (layout.num_rows,) or idx.dtype.is_floating_point:
        raise ValueError(f"draft_rows must be an integer tensor of shape [{layout.num_rows}] (one "
                         f"entry per tree row), got {tuple(idx.shape)} {idx.dtype}")
    idx = idx.to(torch.int64)
    if idx.numel() and (int(idx.min()) < -1 or int(idx.max()) >= num_q):
        raise ValueError(f"draft_rows entries must be -1 or a row of draft_probs (0..{num_q - 1})")
    return idx


def _check_draft_probs(
    draft_probs: Any, draft_rows: Any, layout: TreeLayout, vocab: int, device: torch.device,
    full: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """(q rows, q row index per tree row or -1)."""
    if draft_probs is None:
        raise ValueError(
            "mode='rrs' needs draft_probs [T, V]: row u = the drafter distribution u's children "
            "were sampled from (use mode='target_only' for deterministic candidate sets)"
        )
    q = torch.as_tensor(draft_probs, device=device)
    if draft_rows is None and q.shape != (layout.num_rows, vocab):
        raise ValueError(
            f"draft_probs must have shape [T, V] = [{layout.num_rows}, {vocab}] like logits, "
            f"got {tuple(q.shape)}"
        )
    if draft_rows is not None and (q.dim() != 2 or q.shape[1] != vocab):
        raise ValueError(f"draft_probs must have shape [M, V] with V = {vocab} like logits, "
                         f"got {tuple(q.shape)}")
    if not q.dtype.is_floating_point:
        raise TypeError(f"draft_probs must be floating point, got {q.dtype}")
    index = _check_draft_rows(draft_rows, q.shape[0], layout, device)
    if full:
        _check_rows_are_distributions(q, index, layout)
    draft = layout.parents >= 0
    parent_q = index[layout.global_parents[draft]]
    has_q = parent_q >= 0
    q_drafted = q[parent_q[has_q], layout.tokens[draft][has_q]]
    if bool((q_drafted <= 0).any()):
        row = int(draft.nonzero()[has_q.nonzero()[_first(q_drafted <= 0), 0], 0])
        raise ValueError(
            f"draft token at flat row {row} has zero probability under its parent's draft_probs "
            "row, so it cannot have been sampled from it"
        )
    return q, index


def _check_rows_are_distributions(q: torch.Tensor, index: torch.Tensor, layout: TreeLayout) -> None:
    # Row sums and minima in one pass each, without copying [T, V]: a finite sum rules out
    # inf/nan entries, a non-negative minimum rules out negative ones. Only rows of nodes with
    # children matter (in the compact form: the rows such nodes point at).
    has_kids = torch.zeros(q.shape[0], dtype=torch.bool, device=q.device)
    used = (layout.num_children > 0) & (index >= 0)
    has_kids[index[used]] = True
    sums = q.sum(dim=1, dtype=torch.float32)
    bad = has_kids & ~torch.isfinite(sums)
    if not bool(bad.any()):
        bad = has_kids & (q.amin(dim=1) < 0)
    if bool(bad.any()):
        raise ValueError(
            f"draft_probs row {_first(bad)} (of a node with children) has negative, inf or nan "
            "entries"
        )
    bad = has_kids & ((sums - 1).abs() > PROB_SUM_TOL)
    if bool(bad.any()):
        row = _first(bad)
        raise ValueError(
            f"draft_probs row {row} (of a node with children) sums to {float(sums[row]):.6f}, "
            "not 1: pass probabilities (softmax of the drafter logits), not logits"
        )


def _check_num_draws(
    num_draws: Any, replacement: bool, layout: TreeLayout, device: torch.device
) -> torch.Tensor | None:
    if num_draws is None:
        return None
    n = torch.as_tensor(num_draws, device=device)
    if n.shape != (layout.num_rows,) or n.dtype.is_floating_point:
        raise ValueError(f"num_draws must be an integer tensor of shape [{layout.num_rows}]")
    n = n.to(torch.int64)
    draft = layout.parents >= 0
    if bool((n[draft] < 1).any()):
        raise ValueError("num_draws must be >= 1 for every draft node")
    if not replacement and bool((n[draft] != 1).any()):
        raise ValueError(
            "num_draws > 1 only makes sense with replacement=True (draws without replacement "
            "are distinct)"
        )
    return n


def _check_node_draws(node_draws: Any, draws: torch.Tensor | None, q_index: torch.Tensor,
                      layout: TreeLayout, device: torch.device) -> None:
    """replacement=True: every node with children and a q row must verify all the draws it made.

    Its children's ``num_draws`` (1 each by default) must add up to ``node_draws[u]``. A tree
    cut to a node prefix after merging repeats fails this (the cut drops the draws from the
    first cut sibling on), and verifying what is left would be biased (module docstring)."""
    if node_draws is None:
        raise ValueError(
            "mode='rrs' with replacement=True needs node_draws [T]: how many i.i.d. draws from "
            "its q row each node made (its children's num_draws must add up to it)"
        )
    made = torch.as_tensor(node_draws, device=device)
    if made.shape != (layout.num_rows,) or made.dtype.is_floating_point:
        raise ValueError(f"node_draws must be an integer tensor of shape [{layout.num_rows}]")
    draft = layout.parents >= 0
    per_child = draws[draft] if draws is not None else torch.ones_like(layout.parents[draft])
    covered = torch.zeros(layout.num_rows, dtype=torch.int64, device=device)
    covered.index_add_(0, layout.global_parents[draft], per_child)
    checked = (layout.num_children > 0) & (q_index >= 0)
    bad = checked & (covered != made.to(torch.int64))
    if bool(bad.any()):
        row = _first(bad)
        raise ValueError(
            f"node at flat row {row} made {int(made[row])} i.i.d. draws but its children stand "
            f"for {int(covered[row])} (sum of their num_draws). A tree of merged i.i.d. draws cut "
            "to a node prefix cannot be verified losslessly: which draws survive the cut depends "
            "on their values. Verify the whole tree, or draw without replacement "
            "(replacement=False), whose prefix cuts are lossless"
        )


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


def accept(
    tree: Any,
    logits: torch.Tensor,
    mode: Mode = "greedy",
    sampling: SamplingParamsBatch | None = None,
    generators: Generators = None,
    draft_probs: torch.Tensor | None = None,
    draft_rows: torch.Tensor | None = None,
    replacement: bool | None = None,
    num_draws: torch.Tensor | None = None,
    node_draws: torch.Tensor | None = None,
    max_depth: int | None = None,
    validate: bool = True,
    coin_rows: int | None = None,
) -> AcceptResult:
    """Verify a batch of draft trees against the target's logits at every node row.

    Args:
        tree: flat tree batch (object/mapping with ``offsets``, ``tokens``, ``parents``,
            optional ``depth``; or a tuple of them), see tree_input.py.
        logits: float [T, V], row u = target logits for the token following node u.
        mode: "greedy", "target_only" or "rrs" (see the module docstring).
        sampling: per-request temperature/top-k/top-p/min-p; None = temperature 1, no filters
            (ignored in greedy mode).
        generators: None, one torch.Generator for all requests, or a list of B (None entries
            use torch's default generator).
        draft_probs: float [T, V] drafter distributions, required by "rrs"; with
            ``draft_rows``, only the rows that exist: [M, V].
        draft_rows: "rrs" only, optional: int64 [T], row of ``draft_probs`` holding the q that
            node u's children were drawn from, -1 for nodes whose children were not drawn from
            a q (those nodes use the target-only rule; see the module docstring).
        replacement: "rrs" only and required there: were each node's children drawn i.i.d.
            (True) or without replacement (False)?
        num_draws: "rrs" with replacement only: int64 [T], how many consecutive i.i.d. draws a
            (merged) node stands for, i.e. the draw index of the next sibling's first draw (or
            of the end of its parent's draws) minus this node's first draw index; default 1
            each.
        node_draws: "rrs" only and required with replacement=True: int64 [T], how many i.i.d.
            draws from its q row each node made. For every node with children and a q row,
            its children's num_draws must add up to it; a tree cut to a node prefix after
            merging does not, and is rejected (ValueError; see the module docstring).
        max_depth: pad outputs to max_depth + 1 columns (must be >= the deepest node).
        validate: check that draft_probs rows with children are distributions (one O(T*V)
            pass); tree structure and drafted-token checks are O(T) and always run.
        coin_rows: requests with their own generator draw this many coin rows per call
            (>= their node count), so a seeded request's random stream does not depend on how
            far the scheduler cut its tree (see coins.py).

    Example::

        tree = (torch.tensor([0, 3]), torch.tensor([7, 1, 2]), torch.tensor([-1, 0, 0]))
        res = accept(tree, torch.randn(3, 8), mode="target_only",
                     sampling=SamplingParamsBatch.from_lists([0.8]),
                     generators=[torch.Generator().manual_seed(0)])
        res.emitted[0, : res.num_emitted[0]]  # tokens to append
    """
    if mode not in MODES:
        raise ValueError(f"unknown acceptance mode {mode!r}; expected one of {MODES}")
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError("logits must be a 2-D tensor [T, V]")
    if not logits.dtype.is_floating_point:
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    device = logits.device
    vocab = logits.shape[1]
    fields = unpack_tree(tree, device)       # once: build_layout takes the unpacked tuple as is
    if mode != "rrs":
        roots = _root_only_offsets(fields, device)
        if roots is not None:
            return _accept_roots(roots, logits, mode, sampling, generators, max_depth, coin_rows)
    layout = build_layout(fields, vocab, device)
    if logits.shape[0] != layout.num_rows:
        raise ValueError(
            f"logits has {logits.shape[0]} rows but the tree batch has {layout.num_rows} nodes; "
            "pass the target logits at every node row"
        )
    num_requests = layout.num_requests
    width = layout.max_depth + 1
    if max_depth is not None:
        if max_depth < layout.max_depth:
            raise ValueError(
                f"max_depth={max_depth} is smaller than the deepest node ({layout.max_depth})"
            )
        width = max_depth + 1

    params, is_greedy = _request_params(mode, sampling, num_requests, device)
    q_all: torch.Tensor | None = None
    q_index: torch.Tensor | None = None
    draws: torch.Tensor | None = None
    if mode == "rrs":
        if replacement is None:
            raise ValueError(
                "mode='rrs' needs replacement=True (children drawn i.i.d. from q) or False "
                "(drawn without replacement); the rule that is lossless depends on it"
            )
        q_all, q_index = _check_draft_probs(draft_probs, draft_rows, layout, vocab, device,
                                            full=validate)
        draws = _check_num_draws(num_draws, replacement, layout, device)
        if replacement:
            _check_node_draws(node_draws, draws, q_index, layout, device)
        elif node_draws is not None:
            raise ValueError("node_draws is only used by mode='rrs' with replacement=True")
    elif num_draws is not None or node_draws is not None:
        raise ValueError("num_draws and node_draws are only used by mode='rrs' with "
                         "replacement=True")
    elif draft_rows is not None:
        raise ValueError("draft_rows is only used by mode='rrs'")

    coins = _coins(layout.offsets, layout.request_of_row, generators, is_greedy, coin_rows)

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
        chosen = torch.full_like(rows, -1)
        lookup = torch.ones_like(rows, dtype=torch.bool)  # rows that descend via token match
        greedy_here = is_greedy[active]
        g = greedy_here.nonzero().squeeze(1)
        if g.numel():
            picked[g] = greedy_tokens(logits[rows[g]])
        s = (~greedy_here).nonzero().squeeze(1)
        if s.numel():
            assert params is not None and coins is not None
            srows = rows[s]
            probs = torch.softmax(
                process_logits(
                    logits[srows], params.rows(layout.request_of_row[srows]), inplace=True
                ),
                dim=-1,
                dtype=torch.float32,
            ).to(torch.float64)
            if mode == "target_only":
                picked[s] = sample_categorical(probs, coins[srows, DRAW_COIN])
            else:
                assert q_all is not None and replacement is not None
                has_q = q_index[srows] >= 0
                t = (~has_q).nonzero().squeeze(1)
                if t.numel():           # no q row: target-only rule, as in target_only mode
                    picked[s[t]] = sample_categorical(probs[t], coins[srows[t], DRAW_COIN])
                r = has_q.nonzero().squeeze(1)
                if r.numel():
                    rs, rrows = s[r], srows[r]
                    rp = probs[r] if t.numel() else probs
                    rp /= rp.sum(dim=1, keepdim=True)  # ratios need an exact distribution
                    child, residual = recursive_rejection(
                        rp,
                        q_all[q_index[rrows]].to(torch.float64),
                        layout.children[rrows],
                        layout.tokens,
                        coins[:, ACCEPT_COIN],
                        replacement,
                        draws,
                    )
                    correction = sample_categorical(residual, coins[rrows, DRAW_COIN])
                    picked[rs] = torch.where(child >= 0, layout.tokens[child.clamp(min=0)],
                                             correction)
                    chosen[rs] = child
                    lookup[rs] = False  # a correction ends the walk even if it equals a child
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
