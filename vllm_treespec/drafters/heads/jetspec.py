"""JetSpec causal parallel draft head (paper 001, section 2.2, App. D) and its diffusion-style twin.

The target's features at the context positions (its hidden states at a few layers, concatenated)
are projected to the hidden size (bias-free linear + RMSNorm) and injected into EVERY draft layer
as extra keys/values: layer l's context K/V are its own k/v projections of the projected feature.
Context rows are never queries, so a request's serving cache is just those K/V, appended as rows
are committed and never recomputed.

The draft block of one step: the root token (the token just sampled, at position n; its target
hidden state does not exist yet) embedded with the target's frozen embedding, then d learned-mask
rows at positions n+1..n+d. Mask row j predicts the token AT its own position (unshifted, as in
DFlash/JetSpec), so one forward gives the d per-depth distributions of the tree below the root.
Block rows attend all context rows and, within the block, causally (JetSpec) or bidirectionally
(``within_block="bidirectional"``: the DFlash-style diffusion head the JetSpec and PRESTO papers
compare against).

Deviations, stated: one learned mask vector (the papers use a mask token of the target's
vocabulary); the head has its own LM head (DFlash shares the target's); context K/V skip the
layer's input norm (the projected feature is already normalised).

Training (`forward_train`) runs the blocks of chosen anchors of a window in one pass over the
window's context K/V (train/jetspec_recipe.py picks random anchors); serving (`new_cache`,
`extend`, `draft`) runs only the block. `tests/test_jetspec_head.py` checks both give the same
logits for the same prefix.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from vllm_treespec.drafters.heads.layers import DecoderLayer, RMSNorm, SharedEmbeddingHead
from vllm_treespec.drafters.heads.shape import HeadShape

__all__ = ["JetSpecConfig", "JetSpecHead", "ContextCache"]


@dataclass(frozen=True)
class JetSpecConfig(HeadShape):
    """A JetSpec (or diffusion-style) head's config.json (shape and target: heads/shape.py)."""
    num_layers: int = 2              # draft decoder layers (JetSpec: 5 on a 36-layer target)
    kind: str = field(default="jetspec")

    def __post_init__(self) -> None:
        if self.depth < 1:
            raise ValueError(f"JetSpec depth must be >= 1, got {self.depth}")
        if self.num_layers < 1:
            raise ValueError(f"JetSpec num_layers must be >= 1, got {self.num_layers}")
        super().__post_init__()


@dataclass
class ContextCache:
    """One request's context as every draft layer sees it: roped K/V per layer [kv, n, D], and the
    token after the last context row (the next step's root)."""
    k: list[torch.Tensor]
    v: list[torch.Tensor]
    root: int
    length: int

    @property
    def empty(self) -> bool:
        return self.length == 0


class JetSpecHead(SharedEmbeddingHead):
    def __init__(self, config: JetSpecConfig, embed: nn.Embedding) -> None:
        super().__init__(config, embed)            # the frozen target embedding, checked
        c = config
        h = c.hidden_size
        self.fc = nn.Linear(len(c.feature_layers) * h, h, bias=False)
        self.context_norm = RMSNorm(h, c.rms_norm_eps)
        self.mask_embed = nn.Parameter(torch.randn(h) * 0.02)
        self.layers = nn.ModuleList(
            DecoderLayer(h, c.num_heads, c.num_kv_heads, c.head_dim, c.intermediate_size, c.rope_theta,
                         c.rms_norm_eps) for _ in range(c.num_layers))
        self.norm = RMSNorm(h, c.rms_norm_eps)
        self.lm_head = nn.Linear(h, c.vocab_size, bias=False)

    # -- shared pieces ------------------------------------------------------------------------
    def _context_kv(self, features: torch.Tensor, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per layer (K, V) [B, kv, T, D] of context features [B, T, F] at positions [B, T] or [T]."""
        ctx = self.context_norm(self.fc(features))
        return [layer.self_attn.keys_values(ctx, positions) for layer in self.layers]

    def _block_inputs(self, roots: torch.Tensor) -> torch.Tensor:
        """[..., d + 1, H]: the root's embedding, then d mask rows."""
        d = self.config.depth
        root = self.embed(roots)[..., None, :]
        mask = self.mask_embed.to(root.dtype).expand(*roots.shape, d, -1)
        return torch.cat([root, mask], -2)

    def _block_mask(self, device: torch.device) -> torch.Tensor:
        n = self.config.depth + 1
        block = torch.ones((n, n), dtype=torch.bool, device=device)
        return block.tril() if self.config.within_block == "causal" else block

    def _run(self, x: torch.Tensor, pos: torch.Tensor, mask: torch.Tensor,
             past: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """The last layer's hidden states of the block rows x (before the final norm)."""
        for layer, kv in zip(self.layers, past):
            x = layer(x, pos, mask, past=kv)
        return x

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.norm(h))

    # -- training -----------------------------------------------------------------------------
    def forward_train(self, features: torch.Tensor, next_tokens: torch.Tensor,
                      prefixes: torch.Tensor) -> torch.Tensor:
        """Logits [B, A, d, V] for chosen prefixes of each window.

        features [B, P, F] (row i: the target at position i), next_tokens [B, P] (x_{i+1});
        prefixes [B, A]: prefix g uses context rows 0..g and root x_{g+1} at position g+1; its
        depth-t logits predict x_{g+1+t}, the same (g, t) indexing as DartHead.forward_train.
        Padding entries of `prefixes` may be any valid index; the caller masks their loss."""
        b, p, _ = features.shape
        a = prefixes.shape[1]
        n = self.config.depth + 1
        past = self._context_kv(features, torch.arange(p, device=features.device))
        roots = next_tokens.gather(1, prefixes)                                  # [B, A]
        x = self._block_inputs(roots).reshape(b, a * n, -1)
        pos = (prefixes[..., None] + 1 + torch.arange(n, device=features.device)).reshape(b, a * n)
        ctx_ok = torch.arange(p, device=features.device)[None, None, :] <= prefixes[..., None]   # [B, A, P]
        blocks = torch.block_diag(*[self._block_mask(features.device)] * a)                    # [A n, A n]
        mask = torch.cat([ctx_ok.repeat_interleave(n, 1), blocks.expand(b, -1, -1)], -1)
        # only the mask rows predict; the root row's LM head would be thrown away
        return self._logits(self._run(x, pos, mask, past).reshape(b, a, n, -1)[:, :, 1:])

    # -- serving ------------------------------------------------------------------------------
    def new_cache(self) -> ContextCache:
        c = self.config
        empty = self.fc.weight.new_zeros((c.num_kv_heads, 0, c.head_dim))
        return ContextCache([empty] * c.num_layers, [empty] * c.num_layers, -1, 0)

    def cache_bytes_per_row(self) -> int:
        """Serving cache bytes per context row (K and V of every layer)."""
        c = self.config
        return 2 * c.num_layers * c.num_kv_heads * c.head_dim * self.fc.weight.element_size()

    def truncate(self, cache: ContextCache, keep: int) -> ContextCache:
        """The first `keep` context rows (the root is set by the next `extend`)."""
        return ContextCache([k[:, :keep] for k in cache.k], [v[:, :keep] for v in cache.v], -1, keep)

    def extend(self, cache: ContextCache, features: torch.Tensor, next_tokens: torch.Tensor) -> ContextCache:
        """Append committed context rows (features [m, F]; next_tokens [m], the last one is the root)."""
        if features.shape[0] == 0:
            return cache
        pos = torch.arange(cache.length, cache.length + features.shape[0], device=features.device)
        kv = self._context_kv(features[None], pos)
        return ContextCache([torch.cat([old, k[0]], 1) for old, (k, _) in zip(cache.k, kv)],
                            [torch.cat([old, v[0]], 1) for old, (_, v) in zip(cache.v, kv)],
                            int(next_tokens[-1]), cache.length + features.shape[0])

    def draft(self, caches: list[ContextCache]) -> torch.Tensor:
        """Per-depth log-probs [R, d, V] (float32 or wider): one batched block forward for every
        request over its padded context K/V."""
        if any(c.empty for c in caches):
            raise ValueError("JetSpec draft needs at least one context row per request")
        c = self.config
        r, longest, n = len(caches), max(x.length for x in caches), c.depth + 1
        ref = self.fc.weight
        past = []
        for layer in range(c.num_layers):
            if r == 1:                             # nothing to pad: the cache itself, no copy
                past.append((caches[0].k[layer][None], caches[0].v[layer][None]))
                continue
            pk = ref.new_zeros((r, c.num_kv_heads, longest, c.head_dim))
            pv = torch.zeros_like(pk)
            for i, x in enumerate(caches):
                pk[i, :, :x.length], pv[i, :, :x.length] = x.k[layer], x.v[layer]
            past.append((pk, pv))
        lengths = torch.tensor([x.length for x in caches], device=ref.device)
        ctx_ok = torch.arange(longest, device=ref.device)[None, :] < lengths[:, None]       # [R, P]
        mask = torch.cat([ctx_ok[:, None, :].expand(r, n, longest),
                          self._block_mask(ref.device).expand(r, n, n)], -1)
        pos = lengths[:, None] + torch.arange(n, device=ref.device)
        roots = torch.tensor([x.root for x in caches], dtype=torch.int64, device=ref.device)
        logits = self._logits(self._run(self._block_inputs(roots), pos, mask, past)[:, 1:])
        return torch.log_softmax(logits, -1, dtype=torch.promote_types(logits.dtype, torch.float32))
