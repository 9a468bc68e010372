"""The greedy acceptance rule, once per device (no vLLM import).

From the root, emit the argmax x of the current node's row; if a child of the node carries x,
descend into it, else stop (x is the bonus token). Siblings carry distinct tokens, so the child
is unique. Outputs are bitwise those of decoding without speculation: the argmax is vLLM's own
(`sampling_params.greedy_tokens`), taken once over every node row, then the walk only compares
tokens.

- host: the O(nodes) C++ walk without the GIL (csrc/verify/greedy_walk.cpp, ``vllm_treespec._C``);
- CUDA: the Triton walk, one program per request, queued without a host sync
  (kernels/tree_accept.py; csrc/cuda/tree_accept.cu is its opt-in CUDA twin).

Every greedy request takes this walk, including greedy requests inside a sampled batch
(accept.py hands them over). The torch version the walks are tested against is test-only
(tests/support/greedy_reference.py).
"""
from __future__ import annotations

import torch

from vllm_treespec.tree.batch import TreeBatch
from vllm_treespec.verify.result import AcceptResult
from vllm_treespec.verify.sampling_params import greedy_tokens

__all__ = ["greedy_walk", "host_greedy_walk", "device_greedy_walk"]


def greedy_walk(batch: TreeBatch, logits: torch.Tensor, width: int) -> AcceptResult:
    """Greedy acceptance of a tree batch on the logits' device (CUDA: the Triton walk, else the
    C++ walk, which validates the trees). logits float [T, V] at every node row; width: output
    columns (paths are cut at width tokens, normally the deepest node + 1)."""
    if not isinstance(batch, TreeBatch):
        raise TypeError(f"greedy_walk takes a TreeBatch, got {type(batch).__name__}")
    walk = device_greedy_walk if logits.is_cuda else host_greedy_walk
    return walk(batch, logits, width)


def host_greedy_walk(batch: TreeBatch, logits: torch.Tensor, width: int) -> AcceptResult:
    """`greedy_walk` on the host: one argmax, then the C++ walk (which validates the trees)."""
    from vllm_treespec.native import native

    host = batch.to("cpu")
    target = greedy_tokens(logits).to(device="cpu", dtype=torch.int64)
    emitted, nodes, count = native().greedy_tree_walk(host.offsets.numpy(), host.tokens.numpy(),
                                                      host.parents.numpy(), target.numpy(), width)
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
