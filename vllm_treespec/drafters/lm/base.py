"""What a draft language model runtime offers the draft-model drafter (no vLLM imports).

A runtime wraps one local Hugging Face model directory (a transformer such as Llama/Qwen3, or
Mamba) and keeps a per-request cache in step with each request's committed tokens, so a step
costs a catch-up over the tokens committed since the last step plus one batched call per tree
depth, never a re-prefill of the whole context.

Per step, for the requests that draft:
1. ``admit(req_ids)``: give each request a cache slot (evicting least recently used requests
   outside this step); requests that get none draft nothing this step (bounded memory).
2. ``start_step(req_ids, contexts)``: resync each admitted request's cache to its committed
   tokens (prompt + output; the last one is the tree root), feeding only what the cache does
   not hold yet (a cache whose tokens are not a prefix of the context is recomputed from the
   first difference: preemption, or a request id reused). Returns the log-probs of the token
   after each root. Node 0 of each request's step tree is its root.
3. ``extend(req_index, parent, tokens)``: one batched call for any set of new tree nodes (all
   frontier nodes of all requests at one depth): node j is token ``tokens[j]`` under node
   ``parent[j]`` of request ``req_index[j]``; new nodes get the next free ids of their request
   (1, 2, ... in call order). Returns each new node's next-token log-probs. A node sees the
   committed context plus its own ancestors only (transformers: tree mask over the cache and the
   step's node K/V; Mamba: the parent's recurrent state, copied per branch).
4. ``release(req_ids)``: free finished or aborted requests' slots.

Log-probs are float32 ``[n, vocab]`` torch tensors on the CPU. A runtime is single-threaded and
owned by one worker; every tensor-parallel rank runs the same calls on the same inputs and so
drafts the same trees.
"""
from __future__ import annotations

from typing import Iterable, Protocol, Sequence

import numpy as np
import torch

from vllm_treespec.schema import ConfigError

__all__ = ["DraftLM", "DraftModelError", "DraftModelFileError", "DraftModelMismatchError"]


class DraftModelError(ConfigError):
    """A draft model directory, architecture or memory bound that cannot be served (a config
    error: `vllm-treespec serve` and `config check` report it before vLLM starts)."""


class DraftModelFileError(DraftModelError):
    """The draft model directory itself is unusable: missing, no or unreadable config.json, no
    weights, no tokenizer, an architecture no runtime serves. The fix is another directory, so a
    dry run (vllm_treespec.preflight) reports it apart from a config mistake."""


class DraftModelMismatchError(DraftModelError):
    """A usable draft model made for another target: its tokenizer differs from the served
    model's. The fix is a draft model of that target (or serving the one it was made for)."""


class DraftLM(Protocol):
    architecture: str       # config.json's architectures[0]
    vocab_size: int
    max_tree_nodes: int      # most nodes (root included) one request's step tree may hold
    evictions: int           # requests whose cache was evicted for another (LRU)

    def admit(self, req_ids: Sequence[str]) -> np.ndarray:
        """bool [B]: which requests hold a cache slot for this step."""

    def start_step(self, req_ids: Sequence[str], contexts: Sequence[np.ndarray]) -> torch.Tensor:
        """Resync caches to `contexts` (int token arrays, root last); log-probs [B, V] after each root."""

    def extend(self, req_index: np.ndarray, parent: np.ndarray, tokens: np.ndarray) -> torch.Tensor:
        """Add tree nodes (request index into this step's req_ids, parent node id, token);
        log-probs [n, V] of the token after each new node."""

    def release(self, req_ids: Iterable[str]) -> None:
        """Forget these requests' caches."""

    def tracked_requests(self) -> int:
        """Requests holding a cache slot (a leak check)."""

    def cached_tokens(self, req_id: str) -> int:
        """Committed tokens the request's cache holds (0 when it has no slot)."""
