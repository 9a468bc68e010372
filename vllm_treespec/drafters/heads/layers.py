"""The transformer pieces the heads share: the frozen shared-embedding base, RMSNorm, rotary
embeddings, a masked grouped-query attention over an explicit boolean mask, a SwiGLU MLP and a
pre-norm decoder layer (Qwen3-style: q/k RMSNorm per head). An explicit [Q, K] mask lets one layer serve the training layout
(prefix-shared blocks, train/masks.py) and the serving layout (prefix + one block) unchanged,
which is what keeps training and serving forwards equal.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from vllm_treespec.drafters.heads.shape import HeadShape


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + self.eps)).to(x.dtype) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half rotary embedding of x [B, H, T, D] at integer positions [B, T] (or [T])."""
    d = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d))
    pos = positions.to(torch.float32)
    if pos.dim() == 1:
        pos = pos.unsqueeze(0)
    freqs = pos[:, :, None] * inv[None, None, :]                 # [B, T, D/2]
    cos = torch.cat([freqs.cos(), freqs.cos()], -1)[:, None].to(x.dtype)
    sin = torch.cat([freqs.sin(), freqs.sin()], -1)[:, None].to(x.dtype)
    half = d // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], -1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 rope_theta: float, eps: float) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})")
        self.h, self.kv, self.d, self.theta = num_heads, num_kv_heads, head_dim, rope_theta
        self.q_proj = nn.Linear(hidden, num_heads * head_dim, bias=False)
        self.k_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, num_kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(num_heads * head_dim, hidden, bias=False)
        self.q_norm = RMSNorm(head_dim, eps)
        self.k_norm = RMSNorm(head_dim, eps)

    def keys_values(self, x: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Roped K and V [B, kv, T, D] of rows x [B, T, hidden] (what a serving cache keeps)."""
        b, t, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(b, t, self.kv, self.d)).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.kv, self.d).transpose(1, 2)
        return rope(k, positions, self.theta), v

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """x [B, T, hidden] at positions [B, T]; mask bool [T, S] or [B, T, S] over the keys
        (``past`` rows first, then x's rows); past: cached (K, V) [B, kv, P, D]."""
        b, t, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(b, t, self.h, self.d)).transpose(1, 2)
        q = rope(q, positions, self.theta)
        k, v = self.keys_values(x, positions)
        if past is not None:
            k, v = torch.cat([past[0], k], 2), torch.cat([past[1], v], 2)
        rep = self.h // self.kv
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        m = mask if mask.dim() == 3 else mask.unsqueeze(0)
        # rows that attend nothing (padding) get a harmless uniform row instead of NaNs
        m = m | ~m.any(-1, keepdim=True)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=m.unsqueeze(1))
        return self.o_proj(out.transpose(1, 2).reshape(b, t, self.h * self.d))


class MLP(nn.Module):
    def __init__(self, hidden: int, intermediate: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, intermediate, bias=False)
        self.up_proj = nn.Linear(hidden, intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, hidden: int, num_heads: int, num_kv_heads: int, head_dim: int,
                 intermediate: int, rope_theta: float, eps: float) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(hidden, eps)
        self.self_attn = Attention(hidden, num_heads, num_kv_heads, head_dim, rope_theta, eps)
        self.post_attention_layernorm = RMSNorm(hidden, eps)
        self.mlp = MLP(hidden, intermediate)

    def forward(self, x: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), positions, mask, past)
        return x + self.mlp(self.post_attention_layernorm(x))


class SharedEmbeddingHead(nn.Module):
    """Base of every draft head: it embeds tokens with the frozen target's own embedding (checked
    against the head's config), which is therefore not part of the head's checkpoint."""

    def __init__(self, config: HeadShape, embed: nn.Embedding) -> None:
        super().__init__()
        self.config = config
        if embed.weight.shape != (config.vocab_size, config.hidden_size):
            raise ValueError(f"the target embedding is {tuple(embed.weight.shape)}, the head expects "
                             f"({config.vocab_size}, {config.hidden_size})")
        self.embed = embed.requires_grad_(False)

    def trainable_state(self) -> dict[str, torch.Tensor]:
        """The checkpoint: every parameter except the shared target embedding."""
        return {k: v for k, v in self.state_dict().items() if not k.startswith("embed.")}
