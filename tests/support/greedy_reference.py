"""The greedy acceptance rule in plain torch, for tests only: what the C++ walk
(csrc/verify/greedy_walk.cpp), the Triton walk (kernels/tree_accept.py) and the CUDA walk
(csrc/cuda/tree_accept.cu) are held to. Production never calls it (verify/greedy.py does).

From the root, emit the argmax x of the current node's row (float32, first index on ties); if a
child of the node carries x, descend into it, else stop: x is the bonus token.
"""
from __future__ import annotations

import torch

from vllm_treespec.tree import TreeBatch
from vllm_treespec.verify.result import AcceptResult


def accept_greedy(tree: TreeBatch, logits: torch.Tensor, max_depth: int | None = None) -> AcceptResult:
    """Greedy acceptance of a tree batch (validated by `TreeBatch.check`, as the walks' callers
    are); outputs have max_depth + 1 columns (default: the deepest node + 1)."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2:
        raise ValueError("logits must be a 2-D tensor [T, V]")
    layout = tree.to(logits.device).check(logits.shape[1])
    if logits.shape[0] != layout.num_rows:
        raise ValueError(f"logits has {logits.shape[0]} rows but the tree batch has "
                         f"{layout.num_rows} nodes")
    if max_depth is not None and max_depth < layout.max_depth:
        raise ValueError(f"max_depth={max_depth} is smaller than the deepest node "
                         f"({layout.max_depth})")
    width = (layout.max_depth if max_depth is None else max_depth) + 1
    b = layout.batch_size
    target = logits.to(torch.float32).argmax(dim=-1).tolist()
    tokens, children = layout.tokens.tolist(), layout.children.tolist()
    offsets = layout.offsets.tolist()
    emitted = torch.full((b, width), -1, dtype=torch.int64)
    nodes = torch.full((b, width), -1, dtype=torch.int64)
    count = torch.zeros(b, dtype=torch.int64)
    for r in range(b):
        cur = offsets[r]
        for level in range(width):
            x = target[cur]
            emitted[r, level] = x
            count[r] += 1
            child = next((c for c in children[cur] if c >= 0 and tokens[c] == x), -1)
            if child < 0:
                break
            nodes[r, level] = child - offsets[r]
            cur = child
    return AcceptResult.from_paths(layout.offsets.cpu(), emitted, count, nodes)
