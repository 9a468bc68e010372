"""HeadDrafter: a learned parallel draft head (drafters/heads/: DART, JetSpec, diffusion-style)
drafts every request's tree from ONE head forward per step, over the target's own hidden states.

drafter.type names the head kind (dart, jetspec); the checkpoint's config.json must agree.
Per step, for each request, the proposer hands over the flat rows and positions of the tokens it
committed (prompt chunk, or verified root + accepted tree path) and the target's aux hidden
states of the step. The head appends those rows to the request's cache (concatenated features of
its layers + the token that followed each one; the last of those is the step's root), then one
batched `draft` over all drafting requests gives d per-depth log-prob rows each; their top-k become a `DepthTable`
that the configured builder shapes (DART beam with the n-gram trie as rho, JetSpec best-first,
PRESTO, chain, threshold, static).

Cache and positions: a request's cache covers a contiguous run of positions. Rows recomputed at
or before its end (preemption) truncate it first; a gap (positions never computed, e.g. a prompt
prefix served from vLLM's prefix cache) restarts it at the new rows, so the head then sees less
context than in training. That costs acceptance, never correctness: verification is exact for any
drafts.
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from vllm_treespec.drafters.base import DraftInputs, Drafter, DrafterCapabilities, Proposal, chain_trees
from vllm_treespec.drafters.heads import DraftHead
from vllm_treespec.drafters.heads.checkpoint import check_head_dir, load_head
from vllm_treespec.drafters.lm.loading import DTYPES, resolve_drafter_path
from vllm_treespec.tree import DepthTable, build_tree

__all__ = ["HeadDrafter", "target_embedding"]


def target_embedding(model: Any) -> nn.Embedding:
    """The served model's token embedding as an nn.Embedding sharing its storage (the first
    vocab_size rows; vLLM pads its vocabulary-parallel embedding)."""
    module = getattr(getattr(model, "model", None), "embed_tokens", None)
    if module is None and hasattr(model, "get_input_embeddings"):
        module = model.get_input_embeddings()
    weight = getattr(module, "weight", None)
    if not isinstance(weight, torch.Tensor):
        raise RuntimeError(f"draft head: cannot find the token embedding of {type(model).__name__}")
    vocab = int(getattr(model.config, "vocab_size", weight.shape[0]))
    return nn.Embedding.from_pretrained(weight.detach()[:vocab], freeze=True)


class HeadDrafter(Drafter):

    def __init__(self, cfg: Any, tokenizer_dir: str | None, tree_config: Any, *, max_model_len: int,
                 max_nodes: int, vocab_limit: int | None = None) -> None:
        self.cfg = cfg
        self.name = cfg.type
        self.path = resolve_drafter_path(cfg.path, cfg.type)
        _, self.head_config = check_head_dir(self.path, kind=cfg.type)
        # vLLM aux ids of the head's feature layers (feature layer i = output of layer i = id i+1)
        self.capabilities = DrafterCapabilities(
            uses_target_states=True, aux_layers=tuple(sorted(l + 1 for l in self.head_config.feature_layers)))
        self.builder = tree_config.builder if tree_config is not None else "chain"
        self.params = tree_config.builder_params() if tree_config is not None else {}
        self.rho = None
        if cfg.ngram is not None:
            from vllm_treespec.drafters.ngram_trie import TrieSignal, load_checked_trie

            self.rho = TrieSignal(load_checked_trie(cfg.ngram, tokenizer_dir, None))
        self.vocab_limit = vocab_limit
        self.head: DraftHead | None = None
        self.caches: dict[str, Any] = {}
        self.base_pos: dict[str, int] = {}     # absolute position of the cache's first row
        self.restarts = 0                       # caches restarted at a gap in positions
        self.evictions = 0                      # caches dropped to stay under drafter.memory_mb
        self.max_model_len = max_model_len

    def load(self, target_model: Any) -> None:
        embed = target_embedding(target_model)
        dtype = DTYPES.get(self.cfg.dtype, embed.weight.dtype)      # auto: the served model's
        self.head = load_head(self.path, target_model.config, embed, dtype=dtype, kind=self.cfg.type)
        one = self.head.cache_bytes_per_row() * self.max_model_len
        if one > self.cfg.memory_mb * 2**20:
            from vllm_treespec.schema import ConfigError

            raise ConfigError(f"drafter.memory_mb: one request at max_model_len={self.max_model_len} needs "
                              f"{one / 2**20:.1f} MiB of head cache, more than the bound "
                              f"{self.cfg.memory_mb:g}; raise drafter.memory_mb or lower --max-model-len")
        order = sorted(self.head_config.feature_layers)
        self._feature_order = [order.index(l) for l in self.head_config.feature_layers]

    def on_requests_finished(self, req_ids: Sequence[str]) -> None:
        for r in req_ids:
            self.caches.pop(r, None)
            self.base_pos.pop(r, None)

    def tracked_requests(self) -> dict[str, int]:
        return {"caches": len(self.caches), "base_pos": len(self.base_pos)}

    def counters(self) -> dict[str, int]:
        return {"restarts": self.restarts, "evictions": self.evictions, "cached_requests": len(self.caches),
                "cache_mb": round(self._cache_bytes() / 2**20, 3)}

    def _cache_bytes(self) -> int:
        return sum(self.head.cache_bytes_per_row() * c.length for c in self.caches.values()) if self.head else 0

    def _bound_memory(self, active: set[str]) -> None:
        """Evict least recently drafted caches (not this step's) while over drafter.memory_mb."""
        assert self.head is not None
        per_row, limit = self.head.cache_bytes_per_row(), self.cfg.memory_mb * 2**20
        total = self._cache_bytes()
        for req in list(self.caches):           # insertion order = least recently extended first
            if total <= limit:
                break
            if req in active:
                continue
            total -= per_row * self.caches.pop(req).length
            self.base_pos.pop(req, None)
            self.evictions += 1

    # -- per step -------------------------------------------------------------------------
    def propose(self, inputs: DraftInputs) -> Proposal:
        n = len(inputs)
        trees = chain_trees(inputs, [()] * n)
        target = inputs.target
        if self.head is None or target is None or not target.aux:
            return Proposal(trees)
        with torch.inference_mode():
            self._commit(inputs)
            want = [i for i in range(n) if inputs.budgets[i] > 0 and inputs.req_ids[i] in self.caches]
            if not want:
                return Proposal(trees)
            logprobs = self.head.draft([self.caches[inputs.req_ids[i]] for i in want])
        if self.vocab_limit is not None and self.vocab_limit < logprobs.shape[-1]:
            logprobs[..., self.vocab_limit:] = -torch.inf
        k = min(self.cfg.topk, logprobs.shape[-1])
        top = torch.topk(logprobs, k, dim=-1)
        # one copy to the host for all requests (the head may run on a GPU)
        top_ids, top_lp = top.indices.cpu().numpy(), top.values.double().cpu().numpy()
        params = inputs.tree_params(self.params)             # with a budget.table rule's tree keys
        for j, i in enumerate(want):
            root = inputs.root(i)
            context = inputs.context(i, 16)[:-1] if self.rho is not None else ()
            table = DepthTable(top_ids[j], top_lp[j], root,
                               context=context, rho=self.rho)
            trees[i] = build_tree(self.builder, table, int(inputs.budgets[i]), **params)
        return Proposal(trees)

    def _commit(self, inputs: DraftInputs) -> None:
        """Append each request's committed rows of this step to its head cache."""
        assert self.head is not None and inputs.target is not None
        target = inputs.target
        aux = [torch.as_tensor(a) for a in target.aux]
        for i, req in enumerate(inputs.req_ids):
            rows = target.rows[i] if i < len(target.rows) else ()
            if len(rows) == 0 or target.positions is None:
                continue
            pos = np.asarray(target.positions[i], dtype=np.int64)
            start = int(pos[0])
            cache = self.caches.get(req)
            # the cache holds positions base .. base + length - 1 (contiguous)
            keep = start - self.base_pos[req] if cache is not None else 0
            if cache is not None and keep < cache.length:
                cache = None if keep <= 0 else self.head.truncate(cache, keep)
            elif cache is not None and keep > cache.length:
                cache = None
                self.restarts += 1
            if cache is None:
                cache = self.head.new_cache()
                self.base_pos[req] = start
            weight = self.head.fc.weight              # the head's device and dtype
            idx = torch.as_tensor(np.asarray(rows, dtype=np.int64), device=aux[0].device)
            feats = torch.cat([aux[k][idx] for k in self._feature_order], -1).to(
                device=weight.device, dtype=weight.dtype)
            row = int(inputs.rows[i])
            nxt = torch.as_tensor(inputs.token_ids[row, pos + 1].astype(np.int64),
                                  device=weight.device)
            self.caches.pop(req, None)          # re-inserted last: the LRU order of eviction
            self.caches[req] = self.head.extend(cache, feats, nxt)
        self._bound_memory(set(inputs.req_ids))
