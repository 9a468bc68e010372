"""DART draft head (paper 000, section 3.2, Figure 3): one decoder layer over the target's hidden
states that predicts d future tokens in one forward pass.

Input row i of a prefix: z_i = in_proj([fc(f_i), E(x_{i+1})]), where f_i concatenates the target's
hidden states at position i from a few layers (EAGLE-3's choice: 1, L/2-1, L-4) and E is the
target's frozen token embedding of the token that followed (the shifted token embedding; for the
last row, the token just sampled, i.e. the tree's root). After the prefix come d-1 learned mask
rows. Shifted logits: the last prefix row's output is the depth-1 distribution (the token after
the root), mask row j's output is depth j+2. Attention is causal over the prefix and within the
mask block (``within_block="bidirectional"`` gives the diffusion-style comparison head).

``shifted=False`` is the ablation of DART Table 3 (unshifted logits): d mask rows, mask row j's
output predicts the token at its own position (depth j+1) and the last prefix row's output is
unused.

Deviation, stated: the paper feeds the concatenation [g, e] (2H wide) to the decoder layer; here a
bias-free linear ``in_proj`` maps it to H first, so the decoder layer is a stock Qwen3-style layer.

Training (`forward_train`) runs every prefix of a sequence at once with the prefix-shared mask
(train/masks.py); serving (`DartCache` + `draft`) keeps the prefix rows' keys/values per request
and runs only the last prefix row and the mask rows each step. `tests/test_dart_head.py` checks
that both give the same logits for the same prefix.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from vllm_treespec.drafters.heads.layers import DecoderLayer, RMSNorm, SharedEmbeddingHead
from vllm_treespec.drafters.heads.shape import HeadShape
from vllm_treespec.train.masks import block_positions, prefix_shared_mask

__all__ = ["DartConfig", "DartHead", "DartCache", "eagle3_layers"]


def eagle3_layers(num_layers: int) -> tuple[int, ...]:
    """The target layers DART and EAGLE-3 read: outputs of layers 1, L/2 - 1, L - 4 (0-based).
    For small targets they are clamped to [0, L - 2] (the last layer's output is not a residual
    stream vLLM hands out) and deduplicated."""
    if num_layers < 2:
        raise ValueError(f"a draft head needs a target with >= 2 layers, got {num_layers}")
    top = num_layers - 2
    return tuple(sorted({min(max(l, 0), top) for l in (1, num_layers // 2 - 1, num_layers - 4)}))


@dataclass(frozen=True)
class DartConfig(HeadShape):
    """A DART head's config.json (shape and target: heads/shape.py)."""
    shifted: bool = True             # False: DART Table 3's unshifted ablation
    kind: str = field(default="dart")

    @property
    def mask_rows(self) -> int:
        return self.depth - 1 if self.shifted else self.depth

    def __post_init__(self) -> None:
        if self.depth < 2:
            raise ValueError(f"DART depth must be >= 2 (one prefix row + d-1 mask rows), got {self.depth}")
        super().__post_init__()


@dataclass
class DartCache:
    """One request's prefix rows as the head's layer sees them: roped K/V [kv, n, D], the last
    prefix row's layer input (the query of the depth-1 prediction) and its position."""
    k: torch.Tensor
    v: torch.Tensor
    last_input: torch.Tensor         # [H] z of the last prefix row
    length: int

    @property
    def empty(self) -> bool:
        return self.length == 0


class DartHead(SharedEmbeddingHead):
    def __init__(self, config: DartConfig, embed: nn.Embedding) -> None:
        super().__init__(config, embed)            # the frozen target embedding, checked
        c = config
        h = c.hidden_size
        self.fc = nn.Linear(len(c.feature_layers) * h, h, bias=False)
        self.in_proj = nn.Linear(2 * h, h, bias=False)
        self.mask_embed = nn.Parameter(torch.randn(c.mask_rows, h) * 0.02)
        self.layer = DecoderLayer(h, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size,
                                  c.rope_theta, c.rms_norm_eps)
        self.norm = RMSNorm(h, c.rms_norm_eps)
        self.lm_head = nn.Linear(h, c.vocab_size, bias=False)

    # -- shared pieces ------------------------------------------------------------------------
    def inputs(self, features: torch.Tensor, next_tokens: torch.Tensor) -> torch.Tensor:
        """z [..., H] from concatenated target features [..., F] and the tokens that followed."""
        return self.in_proj(torch.cat([self.fc(features), self.embed(next_tokens)], -1))

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))

    # -- training -----------------------------------------------------------------------------
    def forward_train(self, features: torch.Tensor, next_tokens: torch.Tensor,
                      valid_len: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, P, d, V]: for every prefix 0..g of each sequence, its d per-depth logits.

        features [B, P, F] (row i: the target at position i), next_tokens [B, P] (x_{i+1});
        valid_len [B]: unpadded rows per sequence (None = all P)."""
        b, p, _ = features.shape
        m = self.config.mask_rows
        z = self.inputs(features, next_tokens)
        x = torch.cat([z, self.mask_embed.repeat(p, 1).expand(b, -1, -1)], 1)
        pos = block_positions(p, m).to(features.device)
        lens = [p] * b if valid_len is None else [int(n) for n in valid_len]
        masks = torch.stack([prefix_shared_mask(p, m, valid_len=n, within_block=self.config.within_block)
                             for n in lens]).to(features.device)
        logits = self._logits(self.layer(x, pos, masks))
        blocks = logits[:, p:].reshape(b, p, m, -1)
        if not self.config.shifted:
            return blocks
        return torch.cat([logits[:, :p, None], blocks], 2)

    # -- serving ------------------------------------------------------------------------------
    def new_cache(self) -> DartCache:
        c = self.config
        empty = self.fc.weight.new_zeros((c.num_kv_heads, 0, c.head_dim))
        return DartCache(empty, empty.clone(), self.fc.weight.new_zeros(c.hidden_size), 0)

    def cache_bytes_per_row(self) -> int:
        """Serving cache bytes per context row (K and V of the one layer)."""
        c = self.config
        return 2 * c.num_kv_heads * c.head_dim * self.fc.weight.element_size()

    def truncate(self, cache: DartCache, keep: int) -> DartCache:
        """The first `keep` prefix rows (the last row's input is set by the next `extend`)."""
        return DartCache(cache.k[:, :keep], cache.v[:, :keep], cache.last_input, keep)

    def extend(self, cache: DartCache, features: torch.Tensor, next_tokens: torch.Tensor) -> DartCache:
        """Append committed prefix rows (features [m, F], next_tokens [m]) to a request's cache.
        A prefix row's K/V depend only on its own input, so appending never recomputes the past."""
        if features.shape[0] == 0:
            return cache
        z = self.inputs(features, next_tokens)
        pos = torch.arange(cache.length, cache.length + z.shape[0], device=z.device)
        k, v = self.layer.self_attn.keys_values(self.layer.input_layernorm(z)[None], pos)
        return DartCache(torch.cat([cache.k, k[0]], 1), torch.cat([cache.v, v[0]], 1), z[-1],
                         cache.length + z.shape[0])

    def draft(self, caches: list[DartCache]) -> torch.Tensor:
        """Per-depth log-probs [R, d, V] (float32 or wider) for each request's cached prefix: one
        batched forward of the last prefix row plus the d-1 mask rows of every request, over
        padded caches."""
        if any(c.empty for c in caches):
            raise ValueError("DART draft needs at least one prefix row per request")
        m = self.config.mask_rows
        r, longest = len(caches), max(c.length for c in caches)
        kv, d = self.config.num_kv_heads, self.config.head_dim
        if r == 1:                                 # nothing to pad: the cache itself, no copy
            pk, pv = caches[0].k[None], caches[0].v[None]
        else:
            pk = self.fc.weight.new_zeros((r, kv, longest, d))
            pv = torch.zeros_like(pk)
        q_len = 1 + m
        mask = torch.zeros((r, q_len, longest + q_len), dtype=torch.bool, device=pk.device)
        pos = torch.empty((r, q_len), dtype=torch.int64, device=pk.device)
        x = torch.empty((r, q_len, self.config.hidden_size), dtype=pk.dtype, device=pk.device)
        for i, c in enumerate(caches):
            n = c.length
            if r > 1:
                pk[i, :, :n], pv[i, :, :n] = c.k, c.v
            # the last prefix row is in the cache already; as a query it attends prefix 0..n-1
            mask[i, :, :n] = True
            mask[i, 0, longest:] = False
            pos[i] = torch.arange(n - 1, n + m)
            x[i, 0] = c.last_input
            x[i, 1:] = self.mask_embed
        block = torch.ones((m, m), dtype=torch.bool, device=pk.device)
        if self.config.within_block == "causal":
            block = block.tril()
        mask[:, 1:, longest + 1:] = block
        # the query row of the last prefix row re-enters as a key at slot `longest`; it is the
        # same row as cache slot n-1, so it is masked out there to count it once
        mask[:, :, longest] = False
        logits = self._logits(self.layer(x, pos, mask, past=(pk, pv)))
        if not self.config.shifted:
            logits = logits[:, 1:]
        return torch.log_softmax(logits, -1, dtype=torch.promote_types(logits.dtype, torch.float32))
