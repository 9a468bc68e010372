"""Per-request uniform coins for the stochastic acceptance rules.

Each request draws one block of float64 uniforms, ``coins_per_node`` per tree row, from its own
generator, whatever path the walk later takes. The block size depends only on that request's own
tree, so a seeded request reproduces exactly and does not change when other requests join the
batch (the same idea as vLLM's ``generate_uniform_probs`` in `v1/sample/rejection_sampler.py`).
float64 makes an exact 0.0 practically impossible (vLLM's reason too).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

Generators = torch.Generator | Sequence[torch.Generator | None] | None


def draw_coins(
    offsets: torch.Tensor,
    request_of_row: torch.Tensor,
    coins_per_node: int,
    generators: Generators,
    skip: torch.Tensor,
    block_rows: int | None = None,
) -> torch.Tensor:
    """Return float64 uniforms [T, coins_per_node], rows aligned with the tree rows.

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
        (request_of_row.numel(), coins_per_node), dtype=torch.float64, device=device
    )
    num_pooled = int(pooled_rows.sum())
    if num_pooled:
        pool = torch.rand(
            (num_pooled, coins_per_node),
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
                (rows, coins_per_node), dtype=torch.float64, device=g.device, generator=g
            )
            coins[lo:hi] = block[: hi - lo].to(device)
    return coins
