"""Per-request uniform coins for the stochastic acceptance rules: one layout for every rule.

Each sampled request draws one block of float64 uniforms from its own generator, whatever path
the walk later takes: ``COINS_PER_NODE`` (2) per tree row, ``block_rows`` rows when the caller
fixes the block (else one per node). Every rule reads fixed columns of its node's row:

- column ``ACCEPT_COIN`` (0): the rrs acceptance test of node c against its parent's q row;
- column ``DRAW_COIN`` (1): the token drawn AT a node from a target row: the target-only rule
  (in "target_only" mode and at nodes without a q row in "rrs" mode), the rrs correction /
  bonus draw, and the root-only path (`accept._accept_roots`).

So which coins a request draws, and how far its generator moves, depend only on that request's
own tree (and ``block_rows``), never on the acceptance mode the batch needs or on which other
requests share the call: a seeded request reproduces exactly in any batch (the same idea as
vLLM's ``generate_uniform_probs`` in `v1/sample/rejection_sampler.py`). A node without a q row
reads the same column in "target_only" and "rrs" mode, so switching the batch's mode (a
neighbour with sampled drafts) changes none of its tokens. float64 makes an exact 0.0
practically impossible (vLLM's reason too).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

Generators = torch.Generator | Sequence[torch.Generator | None] | None

COINS_PER_NODE = 2   # uniforms per tree row, for every rule and mode (module docstring)
ACCEPT_COIN = 0      # column: rrs acceptance test of the row's node as its parent's child
DRAW_COIN = 1        # column: the token drawn at the row's node (target-only, correction, root)


def draw_coins(
    offsets: torch.Tensor,
    request_of_row: torch.Tensor,
    generators: Generators,
    skip: torch.Tensor,
    block_rows: int | None = None,
) -> torch.Tensor:
    """Return float64 uniforms [T, COINS_PER_NODE], rows aligned with the tree rows.

    ``block_rows``: a request with its own generator draws exactly this many rows (>= its node
    count) and uses the first ones, so the stream it consumes does not depend on how many nodes
    its tree kept after a cut; node i always gets row i of its block.

    ``generators``: None (torch's default generator for every request), one Generator shared by
    all requests (drawn in one call; handy for simulations), or a list with one entry per request
    (None = default generator). Requests with ``skip`` set (greedy ones) draw nothing; their rows
    hold zeros.
    """
    device = offsets.device
    num_requests = offsets.numel() - 1
    if generators is None or isinstance(generators, torch.Generator):
        shared = generators
        own: list[tuple[int, torch.Generator]] = []
    else:
        if len(generators) != num_requests:
            raise ValueError(
                f"generators has {len(generators)} entries but the batch has {num_requests} "
                "requests (use None for requests without a seed)"
            )
        if not all(g is None or isinstance(g, torch.Generator) for g in generators):
            raise TypeError("generators must hold torch.Generator objects or None")
        shared = None
        own = [(b, g) for b, g in enumerate(generators) if g is not None]

    # Requests without their own generator share one batched draw, in batch order.
    pooled = ~skip
    if own:
        has_own = torch.zeros(num_requests, dtype=torch.bool, device=device)
        has_own[[b for b, _ in own]] = True
        pooled &= ~has_own
    pooled_rows = pooled[request_of_row]
    coins = torch.zeros(
        (request_of_row.numel(), COINS_PER_NODE), dtype=torch.float64, device=device
    )
    num_pooled = int(pooled_rows.sum())
    if num_pooled:
        pool = torch.rand(
            (num_pooled, COINS_PER_NODE),
            dtype=torch.float64,
            device=shared.device if shared is not None else device,
            generator=shared,
        )
        coins[pooled_rows] = pool.to(device)
    if own:
        bounds = offsets.tolist()
        skip_list = skip.tolist()
        for b, g in own:
            if skip_list[b]:
                continue
            lo, hi = bounds[b], bounds[b + 1]
            rows = hi - lo if block_rows is None else block_rows
            if rows < hi - lo:
                raise ValueError(f"block_rows={block_rows} is smaller than request {b}'s {hi - lo} nodes")
            block = torch.rand(
                (rows, COINS_PER_NODE), dtype=torch.float64, device=g.device, generator=g
            )
            coins[lo:hi] = block[: hi - lo].to(device)
    return coins
