"""What tree acceptance returns, whichever rule decided it (greedy.py, accept.py)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["AcceptResult"]


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

    @classmethod
    def from_paths(cls, offsets: torch.Tensor, emitted: torch.Tensor, num_emitted: torch.Tensor,
                   accepted_nodes: torch.Tensor) -> "AcceptResult":
        """The result of these paths, with accepted_rows derived from the batch offsets [B+1]."""
        base = offsets[:-1].to(accepted_nodes.device).unsqueeze(1)
        rows = torch.where(accepted_nodes >= 0, accepted_nodes + base, -1)
        return cls(emitted, num_emitted, accepted_nodes, rows)

    @property
    def num_accepted(self) -> torch.Tensor:
        """Accepted draft tokens per request (emitted minus the bonus/correction token)."""
        return self.num_emitted - 1
