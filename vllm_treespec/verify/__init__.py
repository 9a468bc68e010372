"""Lossless acceptance of draft trees (engine-agnostic: nothing here imports vLLM).

Example::

    import torch
    from vllm_treespec.tree import TreeBatch
    from vllm_treespec.verify import SamplingParamsBatch, accept_target_only, greedy_walk

    # one request: root (token 5) with children 1 and 2; node 1 has child 3
    tree = TreeBatch.from_arrays(offsets=[0, 4], tokens=[5, 1, 2, 3], parents=[-1, 0, 0, 1])
    logits = torch.randn(4, 8)                      # target logits at every node row
    res = greedy_walk(tree, logits, width=3)
    res.emitted, res.num_emitted, res.accepted_nodes  # [1, 3], [1], [1, 3]

    res = accept_target_only(tree, logits,
                             sampling=SamplingParamsBatch.from_lists([0.7], top_p=[0.9]),
                             generators=[torch.Generator().manual_seed(1)])

Every rule takes the step's one tree contract, `vllm_treespec.tree.TreeBatch`. The greedy rule
is `greedy_walk` (C++ on the host, Triton on CUDA); the sampled rules (`accept_target_only`,
`accept_rrs`) share one walk, and `accept(batch, logits, mode=...)` picks one by name. `accept_trees` decides an engine step's rule; `slot_moves` says where compaction
moves the accepted K/V.
"""
from vllm_treespec.verify.accept import (
    MODES,
    accept,
    accept_rrs,
    accept_target_only,
)
from vllm_treespec.verify.decide import accept_trees
from vllm_treespec.verify.greedy import greedy_walk
from vllm_treespec.verify.result import AcceptResult
from vllm_treespec.verify.sampling_params import (
    SAMPLING_EPS,
    SamplingParamsBatch,
    process_logits,
    target_probs,
)

__all__ = [
    "MODES",
    "SAMPLING_EPS",
    "AcceptResult",
    "SamplingParamsBatch",
    "accept",
    "accept_rrs",
    "accept_target_only",
    "accept_trees",
    "greedy_walk",
    "process_logits",
    "target_probs",
]
