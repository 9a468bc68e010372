"""The greedy acceptance rule, once per device (no vLLM import).

From the root, emit the argmax x of the current node's row; if a child of the node carries x,
descend into it, else stop (x is the bonus token). Siblings carry distinct tokens, so the child
is unique. Outputs are bitwise those of decoding without speculation: the argmax is vLLM's own
rule (`sampling_params.greedy_tokens`: first index of the largest float32 value, a NaN first),
then the walk only compares tokens.

- host: the O(nodes) C++ walk without the GIL (csrc/verify/greedy_walk.cpp, ``vllm_treespec._C``).
  For float32 and bfloat16 logits it takes the argmax itself, only at the rows it visits (the
  accepted path and the row it stops at): a vocabulary-wide argmax per verified node, taken
  beforehand, cost more than the rest of the step's acceptance under load, where most verified
  nodes are rejected. Other dtypes take `greedy_tokens` over every row first;
- CUDA: the Triton walk, one program per request, queued without a host sync
  (kernels/tree_accept.py; csrc/cuda/tree_accept.cu is its opt-in CUDA twin).

Every greedy request takes this walk, including greedy requests inside a sampled batch
(accept.py hands them over). The torch version the walks are tested against is test-only
(tests/support/greedy_reference.py).
"""
from __future__ import annotations

import numpy as np
import torch

from vllm_treespec.tree.batch import TreeBatch
from vllm_treespec.verify.result import AcceptResult
from vllm_treespec.verify.sampling_params import greedy_tokens

__all__ = ["greedy_walk", "host_greedy_walk", "device_greedy_walk"]


def greedy_walk(batch: TreeBatch, logits: torch.Tensor, width: int,
                rows: torch.Tensor | np.ndarray | None = None) -> AcceptResult:
    """Greedy acceptance of a tree batch on the logits' device (CUDA: the Triton walk, else the
    C++ walk, which validates the trees). logits float [R, V]; rows: int [T], node i's logits
    row (None: node i's row is i, R = T); width: output columns (paths are cut at width tokens,
    normally the deepest node + 1)."""
    if not isinstance(batch, TreeBatch):
        raise TypeError(f"greedy_walk takes a TreeBatch, got {type(batch).__name__}")
    if not logits.is_cuda:
        return host_greedy_walk(batch, logits, width, rows)
    return device_greedy_walk(batch, _node_logits(logits, rows), width)


def _node_logits(logits: torch.Tensor, rows: torch.Tensor | np.ndarray | None) -> torch.Tensor:
    """[T, V]: node i's logits row (the logits themselves when rows is None)."""
    return logits if rows is None else logits[torch.as_tensor(rows).to(logits.device)]


def host_greedy_walk(batch: TreeBatch, logits: torch.Tensor, width: int,
                     rows: torch.Tensor | np.ndarray | None = None) -> AcceptResult:
    """`greedy_walk` on the host: the C++ walk (which validates the trees), taking the argmax
    only at the rows it visits where it can read the logits (float32 or bfloat16, contiguous
    rows), else after one argmax over every node row."""
    from vllm_treespec.native import native

    host = batch.to("cpu")
    walk_args = (host.offsets.numpy(), host.tokens.numpy(), host.parents.numpy())
    if logits.dim() == 2 and logits.dtype in (torch.float32, torch.bfloat16) and logits.stride(-1) == 1:
        rows = (np.arange(host.tokens.numel(), dtype=np.int64) if rows is None
                else np.ascontiguousarray(torch.as_tensor(rows).cpu().numpy(), dtype=np.int64))
        bf16 = logits.dtype == torch.bfloat16
        view = (logits.view(torch.int16) if bf16 else logits).detach().numpy()
        emitted, nodes, count = native().greedy_tree_walk_logits(*walk_args, view, bf16, rows, width)
    else:
        target = greedy_tokens(_node_logits(logits, rows)).to(device="cpu", dtype=torch.int64)
        emitted, nodes, count = native().greedy_tree_walk(*walk_args, target.numpy(), width)
    f = torch.from_numpy
    return AcceptResult.from_paths(host.offsets, f(emitted), f(count), f(nodes))


def device_greedy_walk(batch: TreeBatch, logits: torch.Tensor, width: int) -> AcceptResult:
    """`greedy_walk` with the Triton kernel on the logits' device, over the batch's device twin
    (`TreeBatch.to`: one copy, made once per step); nothing is read back unless the offsets are
    on the device (their largest tree sizes the kernel's block)."""
    from vllm_treespec.kernels.tree_accept import greedy_tree_accept

    twin = batch.to(logits.device)
    b = batch.batch_size
    emitted, nodes, count = greedy_tree_accept(twin.offsets, twin.tokens, twin.parents,
                                               greedy_tokens(logits), width,
                                               max_nodes=int(batch.sizes.max()) if b else 1)
    return AcceptResult.from_paths(twin.offsets, emitted, count, nodes)
