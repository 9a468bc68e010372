"""Transformer draft LM runtime: a Hugging Face Llama-family model (Llama, Mistral, Qwen2,
Qwen3) run with its own per-request KV cache and tree-masked attention (drafters/lm/base.py).

The HF model supplies the weights, the embedding, the rotary tables and the LM head; each
decoder layer runs as a few torch calls over its weights (q/k/v and gate/up fused), checked
against the HF forward by the tests. Attention is ours because HF's cache objects hold one
sequence per batch row, while a draft tree needs many branches over one cache.

Cache: per layer, K and V ``[slots, max_len + max_tree_nodes, Hkv, D]`` preallocated. Column c
of a slot holds the token at position c for committed tokens; this step's tree node j >= 1 is
written at column ``n + j - 1`` (n = committed tokens, the root is the last of them at column
n - 1) with its RoPE position ``n - 1 + depth``. A node row sees columns ``< n`` plus the columns
of its non-root ancestors and itself; nothing is copied per branch. Columns past the committed
tokens are overwritten by the next catch-up, and never visible before that.

Each call (catch-up or one tree level) is one batched forward: rows are grouped per request and
padded, K/V gathered once per layer for the requests in the call, one SDPA with a boolean mask.
A call with one request (every step at concurrency 1) skips the gather and the padding: SDPA
reads views of that request's cache slot.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from vllm_treespec.drafters.lm.base import DraftModelError
from vllm_treespec.drafters.lm.slots import SlotOwner, SlotTable

__all__ = ["TransformerDraftLM", "TRANSFORMER_ARCHITECTURES", "kv_bytes_per_slot"]

TRANSFORMER_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM",
                             "Qwen3ForCausalLM")


def kv_bytes_per_slot(config: Any, max_len: int, max_tree_nodes: int, dtype: torch.dtype) -> int:
    """Bytes of one request's K/V cache for an HF config of a supported architecture."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * config.num_hidden_layers * (max_len + max_tree_nodes) * kv_heads * head_dim * elem


def _check_supported(model: Any, max_len: int, max_tree_nodes: int) -> str:
    cfg = model.config
    arch = (getattr(cfg, "architectures", None) or [type(model).__name__])[0]
    if arch not in TRANSFORMER_ARCHITECTURES:
        raise DraftModelError(f"draft model architecture {arch!r} is not supported by the transformer "
                              f"runtime; supported: {', '.join(TRANSFORMER_ARCHITECTURES)}")
    window = getattr(cfg, "sliding_window", None)
    sliding = ("sliding_attention" in (getattr(cfg, "layer_types", None) or ())
               or (window is not None and getattr(cfg, "use_sliding_window", True)))
    if sliding and window is not None and window < max_len + max_tree_nodes:
        raise DraftModelError(f"draft model uses sliding-window attention (window {window}) shorter "
                              f"than max_model_len + tree nodes ({max_len + max_tree_nodes}); the "
                              "transformer runtime attends over the full context only")
    return arch


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


@dataclass
class _Rows:
    """One batched forward's query rows, grouped per slot and padded for SDPA."""
    tokens: torch.Tensor       # int64 [T]
    positions: torch.Tensor    # int64 [T] RoPE positions
    slots: torch.Tensor        # int64 [T] cache slot of each row
    cols: torch.Tensor         # int64 [T] cache column each row writes
    group: torch.Tensor        # int64 [T] padded group (request) of each row
    within: torch.Tensor       # int64 [T] row index inside its group
    group_slots: torch.Tensor  # int64 [G] slot of each group
    mask: torch.Tensor         # bool [G, 1, R, L] visible cache columns of each padded row


@dataclass
class _LayerWeights:
    """One decoder layer's weights with q/k/v and gate/up fused, so a layer is a handful of
    torch calls instead of ~20 module dispatches (the draft model is small: per-call overhead,
    not arithmetic, sets its speed on a CPU)."""
    in_norm: tuple[torch.Tensor, float]
    qkv: tuple[torch.Tensor, torch.Tensor | None]
    q_norm: tuple[torch.Tensor, float] | None
    k_norm: tuple[torch.Tensor, float] | None
    o: tuple[torch.Tensor, torch.Tensor | None]
    post_norm: tuple[torch.Tensor, float]
    gate_up: tuple[torch.Tensor, torch.Tensor | None]
    down: tuple[torch.Tensor, torch.Tensor | None]


def _norm(module: Any) -> tuple[torch.Tensor, float]:
    eps = getattr(module, "variance_epsilon", None) or getattr(module, "eps", 1e-6)
    return module.weight.detach(), float(eps)


def _cat_linear(*mods: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    w = torch.cat([m.weight.detach() for m in mods], dim=0)
    biases = [m.bias for m in mods]
    if all(b is None for b in biases):
        return w, None
    return w, torch.cat([b.detach() if b is not None else w.new_zeros(m.weight.shape[0])
                         for m, b in zip(mods, biases)])


def _layer_weights(layer: Any) -> _LayerWeights:
    attn, mlp = layer.self_attn, layer.mlp
    return _LayerWeights(
        in_norm=_norm(layer.input_layernorm),
        qkv=_cat_linear(attn.q_proj, attn.k_proj, attn.v_proj),
        q_norm=_norm(attn.q_norm) if hasattr(attn, "q_norm") else None,
        k_norm=_norm(attn.k_norm) if hasattr(attn, "k_norm") else None,
        o=_cat_linear(attn.o_proj),
        post_norm=_norm(layer.post_attention_layernorm),
        gate_up=_cat_linear(mlp.gate_proj, mlp.up_proj),
        down=_cat_linear(mlp.down_proj))


def _rms(x: torch.Tensor, norm: tuple[torch.Tensor, float]) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), norm[0], norm[1])


class TransformerDraftLM(SlotOwner):
    """DraftLM over an HF Llama-family causal LM (see the module docstring)."""

    def __init__(self, model: Any, *, max_requests: int, max_len: int, max_tree_nodes: int) -> None:
        self.architecture = _check_supported(model, max_len, max_tree_nodes)
        cfg = model.config
        self.model = model.eval()
        inner = model.model
        self.embed, self.layers, self.norm = inner.embed_tokens, list(inner.layers), inner.norm
        self.rotary, self.lm_head = inner.rotary_emb, model.lm_head
        self.vocab_size = int(cfg.vocab_size)
        self.max_len, self.max_tree_nodes = int(max_len), int(max_tree_nodes)
        attn = self.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.num_heads = int(cfg.num_attention_heads)
        self.num_kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.num_heads)
        self.scale = float(attn.scaling)
        self.dtype = next(model.parameters()).dtype
        if getattr(cfg, "hidden_act", "silu") != "silu":
            raise DraftModelError(f"draft model activation {cfg.hidden_act!r} (config.json hidden_act) is "
                                  "not silu; the transformer runtime serves SiLU-gated MLPs")
        self.weights = [_layer_weights(layer) for layer in self.layers]
        self.final_norm = _norm(self.norm)
        shape = (max_requests, self.max_len + self.max_tree_nodes, self.num_kv_heads, self.head_dim)
        self.k_cache = [torch.zeros(shape, dtype=self.dtype) for _ in self.layers]
        self.v_cache = [torch.zeros(shape, dtype=self.dtype) for _ in self.layers]
        self.slots = SlotTable(max_requests)
        self._step_slots = np.zeros(0, dtype=np.int64)
        self._base = np.zeros(0, dtype=np.int64)          # committed tokens per step request
        self._parents: list[list[int]] = []
        self._depths: list[list[int]] = []

    # -- DraftLM (admit, release, evictions, cached_tokens: SlotOwner) ----------------------
    @torch.inference_mode()
    def start_step(self, req_ids: Sequence[str], contexts: Sequence[np.ndarray]) -> torch.Tensor:
        slots, tokens, positions, last, fed = [], [], [], [], 0
        for req_id, ctx in zip(req_ids, contexts):
            ctx = np.asarray(ctx, dtype=np.int64)
            s = self.slots.slot(req_id)
            if s is None:
                raise KeyError(f"request {req_id!r} has no draft cache slot; admit() it first")
            n = ctx.shape[0]
            if not 1 <= n <= self.max_len:
                raise ValueError(f"request {req_id!r}: context of {n} tokens; the draft cache holds "
                                 f"1..{self.max_len}")
            start = min(self.slots.reuse(s, ctx), n - 1)     # the root is always fed: its logits
            slots.append(np.full(n - start, s, dtype=np.int64))
            tokens.append(ctx[start:])
            positions.append(np.arange(start, n, dtype=np.int64))
            fed += n - start
            last.append(fed - 1)
            self.slots.record(s, ctx)
        self._step_slots = np.array([self.slots.slot(r) for r in req_ids], dtype=np.int64)
        self._base = np.array([self.slots.length(s) for s in self._step_slots], dtype=np.int64)
        self._parents = [[-1] for _ in req_ids]
        self._depths = [[0] for _ in req_ids]
        if not req_ids:
            return torch.zeros(0, self.vocab_size, dtype=torch.float32)
        pos = np.concatenate(positions)
        rows = self._rows(np.concatenate(tokens), pos, np.concatenate(slots), pos,
                          prefix=pos + 1, ancestors=None)
        return self._forward(rows, torch.as_tensor(last, dtype=torch.int64))

    @torch.inference_mode()
    def extend(self, req_index: np.ndarray, parent: np.ndarray, tokens: np.ndarray) -> torch.Tensor:
        req_index = np.asarray(req_index, dtype=np.int64)
        parent = np.asarray(parent, dtype=np.int64)
        tokens = np.asarray(tokens, dtype=np.int64)
        n = req_index.shape[0]
        if parent.shape != (n,) or tokens.shape != (n,):
            raise ValueError(f"extend: req_index {req_index.shape}, parent {parent.shape} and tokens "
                             f"{tokens.shape} must be equal 1-D shapes")
        if n == 0:
            return torch.zeros(0, self.vocab_size, dtype=torch.float32)
        existing = [len(p) for p in self._parents]
        positions = np.empty(n, dtype=np.int64)
        cols = np.empty(n, dtype=np.int64)
        ancestors: list[list[int]] = []
        for j, (b, p) in enumerate(zip(req_index.tolist(), parent.tolist())):
            if not 0 <= b < len(self._parents):
                raise IndexError(f"extend: request index {b} is not in this step's {len(self._parents)} requests")
            par, dep = self._parents[b], self._depths[b]
            if not 0 <= p < existing[b]:
                raise ValueError(f"extend: parent node {p} of request {b} does not exist before this call")
            node = len(par)
            if node >= self.max_tree_nodes:
                raise ValueError(f"extend: request {b} would exceed {self.max_tree_nodes} tree nodes")
            par.append(p)
            dep.append(dep[p] + 1)
            base = int(self._base[b])
            positions[j] = base - 1 + dep[node]
            cols[j] = base + node - 1
            chain, v = [], node
            while v > 0:
                chain.append(base + v - 1)
                v = par[v]
            ancestors.append(chain)
        rows = self._rows(tokens, positions, self._step_slots[req_index], cols,
                          prefix=self._base[req_index], ancestors=ancestors)
        return self._forward(rows, None)

    # -- forward -------------------------------------------------------------------------
    def _rows(self, tokens: np.ndarray, positions: np.ndarray, slots: np.ndarray, cols: np.ndarray,
              prefix: np.ndarray, ancestors: list[list[int]] | None) -> _Rows:
        """Group rows per slot (groups in slot order) and build the padded visibility mask:
        columns < prefix[t] plus the row's `ancestors` columns (tree rows)."""
        group_slots, group = np.unique(slots, return_inverse=True)
        order = np.argsort(group, kind="stable")
        within = np.empty_like(group)
        counts = np.bincount(group, minlength=group_slots.shape[0])
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        within[order] = np.arange(group.shape[0]) - np.repeat(starts, counts)
        width = int(max(cols.max() + 1, prefix.max()))
        mask = np.zeros((group_slots.shape[0], int(counts.max()), width), dtype=bool)
        colrange = np.arange(width)
        mask[group, within] = colrange[None, :] < prefix[:, None]
        if ancestors is not None:
            for t, chain in enumerate(ancestors):
                mask[group[t], within[t], chain] = True
        pad = np.ones(mask.shape[:2], dtype=bool)
        pad[group, within] = False
        mask[pad, 0] = True                     # padded rows see one column: no NaN, dropped later
        f = torch.from_numpy
        return _Rows(f(tokens), f(positions), f(slots), f(cols), f(group), f(within),
                     f(group_slots), f(mask).unsqueeze(1))

    def _forward(self, rows: _Rows, keep: torch.Tensor | None) -> torch.Tensor:
        """Run the layers over `rows` (writing their K/V); log-probs [.., V] of rows `keep`
        (None = all rows), float32."""
        x = self.embed(rows.tokens)
        cos, sin = self.rotary(x, rows.positions.unsqueeze(0))
        cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)               # [T, 1, D]
        t = rows.tokens.shape[0]
        g, r, width = rows.mask.shape[0], rows.mask.shape[2], rows.mask.shape[3]
        hq, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        # rows are grouped in slot order with `within` = arange per group, so with one group and no
        # padding (r == t) the padded layout IS the row order
        single = int(rows.group_slots[0]) if g == 1 and r == t else None
        for w, k_cache, v_cache in zip(self.weights, self.k_cache, self.v_cache):
            qkv = F.linear(_rms(x, w.in_norm), *w.qkv)
            q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
            q, k, v = q.view(t, hq, d), k.view(t, hkv, d), v.view(t, hkv, d)
            if w.q_norm is not None:
                q, k = _rms(q, w.q_norm), _rms(k, w.k_norm)
            q = q * cos + _rotate_half(q) * sin
            k = k * cos + _rotate_half(k) * sin
            k_cache[rows.slots, rows.cols] = k.to(k_cache.dtype)
            v_cache[rows.slots, rows.cols] = v.to(v_cache.dtype)
            if single is not None:               # one request: cache views, no gather or padding
                kp = k_cache[single:single + 1, :width].transpose(1, 2)    # [1, Hkv, L, D]
                vp = v_cache[single:single + 1, :width].transpose(1, 2)
                qp = q.unsqueeze(0)
            else:
                kp = k_cache[rows.group_slots, :width].transpose(1, 2)    # [G, Hkv, L, D]
                vp = v_cache[rows.group_slots, :width].transpose(1, 2)
                qp = q.new_zeros(g, r, hq, d)
                qp[rows.group, rows.within] = q
            o = F.scaled_dot_product_attention(qp.transpose(1, 2), kp.to(q.dtype), vp.to(q.dtype),
                                               attn_mask=rows.mask, scale=self.scale, enable_gqa=True)
            if single is not None:
                o = o.transpose(1, 2)[0].reshape(t, hq * d)
            else:
                o = o.transpose(1, 2)[rows.group, rows.within].reshape(t, hq * d)
            x = x + F.linear(o, *w.o)
            gate, up = F.linear(_rms(x, w.post_norm), *w.gate_up).chunk(2, dim=-1)
            x = x + F.linear(F.silu(gate) * up, *w.down)
        if keep is not None:
            x = x[keep]
        return torch.log_softmax(self.lm_head(_rms(x, self.final_norm)).float(), dim=-1)
