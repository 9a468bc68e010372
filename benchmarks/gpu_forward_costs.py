"""GPU forward costs for projecting tree speculation onto a GPU: target verify forwards, draft
heads and a small draft LM, timed on one accelerator (meant for one lent H100, 80 GB, no vLLM).

Hardware assumption: on a GPU an 8B target's forward over 1..128 query rows per request costs
almost the same as over one row (weights are read once; the step is memory-bound), which is what
could make heads and draft LMs that do not pay on the 2-core CPU pay there. This script measures
that curve and the drafters' own costs; benchmarks/project_gpu_speedup.py turns them into
projected speedups with the acceptance the CPU fixture reaches.

Measured (bf16, random weights randn * 0.02 drawn on the device; fresh random token ids before
every timed run):

- target: a Llama-3-8B-shaped decoder (hidden 4096, 32 layers, 32 q / 8 KV heads of 128, SwiGLU
  14336, vocab 128256, RMSNorm, RoPE, fused qkv / gate_up weights, untied LM head), B requests
  each with a KV cache of --context rows and n new query rows (n in --rows), attention of the
  new rows over cache + new rows with a lower-right causal mask (the method actually used is
  validated against an fp32 reference at start and recorded: the flash kernel's lower-right
  causal when it passes, else SDPA with GQA-packed queries and an explicit boolean mask; one
  decode row: SDPA without a mask), LM head over every row. Each shape
  is captured in a CUDA graph and replays are timed with CUDA events (median of --reps); one
  eager run per shape is kept for reference (median of --eager-reps, wall clock).
- heads: the project's DART / JetSpec / diffusion-style heads (vllm_treespec/drafters/heads/),
  scaled to the target (hidden, vocab, EAGLE-3 feature layers of a 32-layer target, the
  target's attention / MLP shape; DART 1 layer, JetSpec and diffusion 2 layers as their
  fixtures; depth 8). `step_eager_ms`: one drafting step as drafters/parallel_head.py runs it
  (per request: gather the committed rows' features, `extend` the head cache; then one batched
  `draft`, top-k and the copy of the top-k to the host), wall clock, eager. `core_graph_ms`: the
  same arithmetic (commit rows' K/V + the draft block forward + log-softmax + top-k) over
  fixed-shape padded caches in a CUDA graph: what a graph-captured drafter would cost.
- draft_lm: a Llama-shaped draft LM (hidden 1024, 12 layers, 16 q / 4 KV heads of 64, SwiGLU
  2816, vocab 128256, tied embeddings, about 1/30 of the target); one decode row per request
  (graph and eager) and the greedy k-step chain (k forwards + argmax, one graph).

    python benchmarks/gpu_forward_costs.py --out /tmp/costs            # GPU, < 120 s on an H100
    python benchmarks/gpu_forward_costs.py --device cpu --tiny --out /tmp/costs   # CI smoke, seconds

Writes OUT/gpu_forward_costs.json. Never imports vLLM (checked at the end); every measurement
catches its own exception and records it instead of aborting the run.
"""
from __future__ import annotations

import argparse
import importlib.metadata
import json
import math
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))    # run from a plain checkout

__all__ = ["LlamaShape", "TARGET_8B", "DRAFT_LM", "main", "run"]


# -- shapes ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class LlamaShape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tie_embeddings: bool = False
    rope_theta: float = 500000.0
    eps: float = 1e-5

    def params(self) -> int:
        """Parameter count (embedding + layers + norm + LM head unless tied)."""
        h, q, kv = self.hidden, self.heads * self.head_dim, self.kv_heads * self.head_dim
        layer = h * (q + 2 * kv) + q * h + 3 * h * self.intermediate + 2 * h
        return self.vocab * h * (1 if self.tie_embeddings else 2) + self.layers * layer + h


TARGET_8B = LlamaShape(4096, 32, 32, 8, 128, 14336, 128256)
DRAFT_LM = LlamaShape(1024, 12, 16, 4, 64, 2816, 128256, tie_embeddings=True)
TINY_TARGET = LlamaShape(64, 2, 4, 2, 16, 128, 512)
TINY_DRAFT = LlamaShape(32, 2, 4, 2, 8, 64, 512, tie_embeddings=True)


# -- timing ---------------------------------------------------------------------------------

class Budget:
    """Wall-clock guard: measurements after the deadline are skipped and recorded as such."""

    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.seconds = seconds

    def left(self) -> float:
        return self.seconds - (time.monotonic() - self.start)

    def check(self) -> None:
        if self.left() <= 0:
            raise TimeoutError(f"skipped: --budget-s {self.seconds:g} spent")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_eager(fn: Callable[[], Any], device: torch.device, reps: int,
               refresh: Callable[[], None] | None = None) -> float:
    """Median wall ms of fn() with the device synchronised around it: eager cost including the
    host's kernel-launch overhead, which is what an uncaptured drafter pays."""
    out = []
    for _ in range(reps):
        if refresh is not None:
            refresh()
        _sync(device)
        t = time.perf_counter()
        fn()
        _sync(device)
        out.append(1e3 * (time.perf_counter() - t))
    return statistics.median(out)


def time_graph(fn: Callable[[], Any], device: torch.device, reps: int,
               refresh: Callable[[], None] | None = None, warmup: int = 3) -> tuple[float, str]:
    """(median ms, method) of fn captured in a CUDA graph, each replay timed with CUDA events.
    On a CPU there are no graphs: the same fn is timed eagerly (method says so)."""
    if device.type != "cuda":
        for _ in range(warmup):
            fn()
        return time_eager(fn, device, reps, refresh), "eager wall clock (no CUDA graphs on cpu)"
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):                    # warm-up off the capture stream (cuBLAS, caches)
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        keep = fn()                                    # noqa: F841  (outputs live in the graph pool)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(2):
        graph.replay()
    out = []
    for _ in range(reps):
        if refresh is not None:
            refresh()
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    del graph, keep
    return statistics.median(out), f"CUDA graph replay, CUDA events, median of {reps}"


# -- attention of new rows over cache + new rows ---------------------------------------------

def _reference_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """fp32 lower-right causal GQA attention: q [B, H, n, D], k/v [B, KV, S, D]."""
    n, s = q.shape[2], k.shape[2]
    rep = q.shape[1] // k.shape[1]
    k, v = k.float().repeat_interleave(rep, 1), v.float().repeat_interleave(rep, 1)
    scores = q.float() @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    allowed = torch.ones(n, s, dtype=torch.bool, device=q.device).tril(s - n)
    return scores.masked_fill(~allowed, float("-inf")).softmax(-1) @ v


def _lower_right_mask(n: int, s: int, device: torch.device) -> torch.Tensor:
    return torch.ones(n, s, dtype=torch.bool, device=device).tril(s - n)


def _packed(q: torch.Tensor, kv_heads: int) -> torch.Tensor:
    """q [B, H, n, D] -> [B, KV, rep * n, D]: each KV head's query heads stacked along the rows
    (head h reads KV head h // rep), so GQA runs as plain attention with no K/V copies."""
    b, h, n, d = q.shape
    return q.reshape(b, kv_heads, (h // kv_heads) * n, d)


class AttentionOp:
    """Attention of n new query rows over S = cache + n keys (lower-right causal, GQA).

    n == 1 (decode): nothing to mask; the query heads of each KV head are packed as rows
    (`_packed`) and SDPA runs without a mask (the flash path on a GPU). n > 1 by kind:
    "flash_lower_right": the aten flash kernel with is_causal, whose causal is lower-right (what
    torch.nn.attention.bias.causal_lower_right dispatches to), GQA heads passed as they are;
    "sdpa_packed_gqa_mask": packed query heads, SDPA with the boolean lower-right mask tiled per
    packed head (PyTorch picks the backend, memory-efficient on a GPU);
    "sdpa_bool_mask_gqa": SDPA with a boolean mask and enable_gqa."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self._masks: dict[tuple[int, int, int], torch.Tensor] = {}

    def _mask(self, n: int, s: int, tile: int, device: torch.device) -> torch.Tensor:
        key = (n, s, tile)
        if key not in self._masks:                     # built before capture (warm-up runs first)
            self._masks[key] = _lower_right_mask(n, s, device).repeat(tile, 1)
        return self._masks[key]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, h, n, d = q.shape
        kv, s = k.shape[1], k.shape[2]
        if n == 1:
            return F.scaled_dot_product_attention(_packed(q, kv), k, v).reshape(b, h, n, d)
        if self.kind == "flash_lower_right":
            return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True, False)[0]
        if self.kind == "sdpa_packed_gqa_mask":
            mask = self._mask(n, s, h // kv, q.device)
            return F.scaled_dot_product_attention(_packed(q, kv), k, v, attn_mask=mask).reshape(b, h, n, d)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self._mask(n, s, 1, q.device), enable_gqa=True)


def pick_attention(device: torch.device, dtype: torch.dtype, heads: int, kv_heads: int,
                   head_dim: int) -> tuple[AttentionOp, dict[str, str]]:
    """The first attention kind that matches the fp32 reference on a small case (flash first on
    CUDA); the tries are recorded so the JSON says what ran and why."""
    gen = torch.Generator(device="cpu").manual_seed(0)
    tries: dict[str, str] = {}
    kinds = (["flash_lower_right"] if device.type == "cuda" else []) + ["sdpa_packed_gqa_mask",
                                                                        "sdpa_bool_mask_gqa"]
    for kind in kinds:
        op = AttentionOp(kind)
        try:
            for n, s in ((1, 37), (5, 37), (16, 16)):
                q = torch.randn(2, heads, n, head_dim, generator=gen).to(device, dtype)
                kv = torch.randn(2, 2, kv_heads, s, head_dim, generator=gen).to(device, dtype)
                # the model passes transposed views of [B, S, KV, D] caches: test that layout too
                k = kv[0].transpose(1, 2).contiguous().transpose(1, 2)
                err = (op(q, k, kv[1]).float() - _reference_attention(q, k, kv[1])).abs().max().item()
                if not err < 3e-2:
                    raise AssertionError(f"max abs error {err:.3g} vs the fp32 reference (n={n}, S={s})")
            tries[kind] = "ok"
            return op, tries
        except Exception as e:                          # noqa: BLE001 - recorded, next kind tried
            tries[kind] = f"{type(e).__name__}: {e}"[:300]
    raise RuntimeError(f"no attention kind passed: {tries}")


# -- a Llama-shaped decoder over a static KV cache --------------------------------------------

def _randn(shape: tuple[int, ...], device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, device=device, dtype=dtype).mul_(0.02)


class Llama:
    """Functional Llama decoder with random weights and a static per-layer KV cache
    [B, S_max, KV, D] holding `context` random rows; forward(ids, start) writes its rows'
    K/V at start.. and attends cache[:start + n]. Everything has fixed shapes per (B, n, start),
    so a forward can be captured in a CUDA graph."""

    def __init__(self, shape: LlamaShape, device: torch.device, dtype: torch.dtype, attention: AttentionOp,
                 batch: int, max_len: int) -> None:
        s, self.shape, self.attention = shape, shape, attention
        h, q, kv = s.hidden, s.heads * s.head_dim, s.kv_heads * s.head_dim
        self.embed = _randn((s.vocab, h), device, dtype)
        self.lm_head = self.embed if s.tie_embeddings else _randn((s.vocab, h), device, dtype)
        self.norm = torch.ones(h, device=device, dtype=dtype)
        self.layers = [{"ln1": torch.ones(h, device=device, dtype=dtype),
                        "qkv": _randn((q + 2 * kv, h), device, dtype), "o": _randn((h, q), device, dtype),
                        "ln2": torch.ones(h, device=device, dtype=dtype),
                        "gate_up": _randn((2 * s.intermediate, h), device, dtype),
                        "down": _randn((h, s.intermediate), device, dtype)} for _ in range(s.layers)]
        self.batch, self.max_len = batch, max_len
        cache = (batch, max_len, s.kv_heads, s.head_dim)
        self.k_cache = [torch.randn(cache, device=device, dtype=dtype) for _ in range(s.layers)]
        self.v_cache = [torch.randn(cache, device=device, dtype=dtype) for _ in range(s.layers)]
        inv = 1.0 / (s.rope_theta ** (torch.arange(0, s.head_dim, 2, device=device, dtype=torch.float32) / s.head_dim))
        freqs = torch.arange(max_len, device=device, dtype=torch.float32)[:, None] * inv[None]
        self.cos = torch.cat([freqs.cos(), freqs.cos()], -1).to(dtype)    # [S_max, D]
        self.sin = torch.cat([freqs.sin(), freqs.sin()], -1).to(dtype)

    def _rope(self, x: torch.Tensor, start: int) -> torch.Tensor:
        n, half = x.shape[1], x.shape[-1] // 2
        cos, sin = self.cos[start:start + n, None], self.sin[start:start + n, None]
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    def forward(self, ids: torch.Tensor, start: int) -> torch.Tensor:
        """Logits [B, n, V] of ids [B, n] at positions start..start+n-1."""
        s = self.shape
        b, n = ids.shape
        end = start + n
        if end > self.max_len:
            raise ValueError(f"positions up to {end} exceed the cache ({self.max_len})")
        x = F.embedding(ids, self.embed)
        for i, w in enumerate(self.layers):
            qkv = F.linear(F.rms_norm(x, (s.hidden,), w["ln1"], s.eps), w["qkv"])
            q, k, v = qkv.split([s.heads * s.head_dim, s.kv_heads * s.head_dim, s.kv_heads * s.head_dim], -1)
            q = self._rope(q.view(b, n, s.heads, s.head_dim), start)
            self.k_cache[i][:b, start:end] = self._rope(k.view(b, n, s.kv_heads, s.head_dim), start)
            self.v_cache[i][:b, start:end] = v.view(b, n, s.kv_heads, s.head_dim)
            o = self.attention(q.transpose(1, 2), self.k_cache[i][:b, :end].transpose(1, 2),
                               self.v_cache[i][:b, :end].transpose(1, 2))
            x = x + F.linear(o.transpose(1, 2).reshape(b, n, s.heads * s.head_dim), w["o"])
            gate, up = F.linear(F.rms_norm(x, (s.hidden,), w["ln2"], s.eps), w["gate_up"]).chunk(2, -1)
            x = x + F.linear(F.silu(gate) * up, w["down"])
        return F.linear(F.rms_norm(x, (s.hidden,), self.norm, s.eps), self.lm_head)


# -- measurements ---------------------------------------------------------------------------

@dataclass
class Settings:
    device: torch.device
    dtype: torch.dtype
    tiny: bool
    context: int
    batches: tuple[int, ...]
    rows: tuple[int, ...]
    chain_ks: tuple[int, ...]
    commit_rows: int
    reps: int
    eager_reps: int
    budget: Budget
    parts: tuple[str, ...] = ("target", "heads", "draft_lm")


def _measure(record: dict[str, Any], budget: Budget, fn: Callable[[], dict[str, Any]]) -> None:
    """Run one measurement into `record`; any failure (budget, OOM, a kernel refusing a shape)
    is stored as record["error"] and the run goes on."""
    try:
        budget.check()
        record.update(fn())
    except Exception as e:                              # noqa: BLE001 - recorded in the JSON
        record["error"] = f"{type(e).__name__}: {e}"[:500]
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def measure_target(cfg: Settings, shape: LlamaShape, attention: AttentionOp) -> dict[str, Any]:
    """Graph and eager ms of one target forward per (B, n): the verify step's cost curve."""
    model = Llama(shape, cfg.device, cfg.dtype, attention, max(cfg.batches), cfg.context + max(cfg.rows))
    results = []
    for b in cfg.batches:
        for n in cfg.rows:
            rec: dict[str, Any] = {"batch": b, "rows": n, "query_rows_total": b * n}
            ids = torch.randint(0, shape.vocab, (b, n), device=cfg.device)

            def one(rec: dict[str, Any] = rec, ids: torch.Tensor = ids) -> dict[str, Any]:
                fwd = lambda: model.forward(ids, cfg.context)             # noqa: E731
                fresh = lambda: ids.random_(0, shape.vocab)               # noqa: E731
                ms, method = time_graph(fwd, cfg.device, cfg.reps, fresh)
                return {"graph_ms": ms, "eager_ms": time_eager(fwd, cfg.device, cfg.eager_reps, fresh),
                        "timing": method}

            _measure(rec, cfg.budget, one)
            results.append(rec)
    return {"results": results, "embed": model.embed}      # the model is freed on return


def measure_draft_lm(cfg: Settings, shape: LlamaShape, attention: AttentionOp) -> list[dict[str, Any]]:
    """Per B: one decode row per request (graph, eager) and greedy k-step chains in one graph."""
    model = Llama(shape, cfg.device, cfg.dtype, attention, max(cfg.batches), cfg.context + max(cfg.chain_ks) + 1)
    results = []
    for b in cfg.batches:
        rec: dict[str, Any] = {"batch": b}
        ids = torch.randint(0, shape.vocab, (b, 1), device=cfg.device)
        fresh = lambda ids=ids: ids.random_(0, shape.vocab)               # noqa: E731

        def one(ids: torch.Tensor = ids, fresh: Callable[[], Any] = fresh) -> dict[str, Any]:
            fwd = lambda: model.forward(ids, cfg.context)                 # noqa: E731
            ms, method = time_graph(fwd, cfg.device, cfg.reps, fresh)
            return {"forward_graph_ms": ms, "forward_eager_ms": time_eager(fwd, cfg.device, cfg.eager_reps, fresh),
                    "timing": method}

        _measure(rec, cfg.budget, one)
        chains: dict[str, Any] = {}
        for k in cfg.chain_ks:
            def chain(k: int = k, ids: torch.Tensor = ids) -> torch.Tensor:
                tok = ids
                for i in range(k):
                    tok = model.forward(tok, cfg.context + i)[:, -1:].argmax(-1)
                return tok

            c: dict[str, Any] = {}
            _measure(c, cfg.budget, lambda chain=chain: {"graph_ms": time_graph(chain, cfg.device, cfg.reps, fresh)[0]})
            chains[str(k)] = c.get("graph_ms", c)
        rec["chain_graph_ms"] = chains
        results.append(rec)
    return results


# -- draft heads ----------------------------------------------------------------------------

def head_configs(target: LlamaShape) -> dict[str, Any]:
    """The project's head configs scaled to the target: EAGLE-3 feature layers of the target,
    the target's attention / MLP shape, depth 8; DART 1 layer, JetSpec / diffusion 2 layers
    (benchmarks/treespec_fixtures/heads.py), diffusion = bidirectional attention inside the block."""
    from vllm_treespec.drafters.heads.dart import DartConfig, eagle3_layers
    from vllm_treespec.drafters.heads.jetspec import JetSpecConfig

    common = dict(hidden_size=target.hidden, vocab_size=target.vocab, target_num_layers=target.layers,
                  feature_layers=eagle3_layers(target.layers), depth=8, num_heads=target.heads,
                  num_kv_heads=target.kv_heads, head_dim=target.head_dim,
                  intermediate_size=target.intermediate, rope_theta=target.rope_theta,
                  rms_norm_eps=target.eps)
    return {"dart": DartConfig(**common),
            "jetspec": JetSpecConfig(**common, num_layers=2),
            "diffusion": JetSpecConfig(**common, num_layers=2, within_block="bidirectional")}


HEAD_TOPK = {"dart": 25, "jetspec": 8, "diffusion": 8}    # drafter.topk of the presets / replay configs


def build_head(kind: str, config: Any, embed: torch.Tensor, device: torch.device, dtype: torch.dtype) -> Any:
    """A head with its default random init, built on the device (an 8B-scale head is ~1B params)."""
    from torch import nn

    from vllm_treespec.drafters.heads.dart import DartHead
    from vllm_treespec.drafters.heads.jetspec import JetSpecHead

    cls = DartHead if kind == "dart" else JetSpecHead
    with torch.device(device):
        head = cls(config, nn.Embedding.from_pretrained(embed, freeze=True))
    return head.to(dtype).eval()


def _committed_inputs(head: Any, cfg: Settings, b: int, rows: int) -> tuple[list[torch.Tensor], torch.Tensor]:
    """Random target aux states (one per feature layer, [b * rows, H]) and next tokens [b, rows]."""
    c = head.config
    aux = [torch.randn(b * rows, c.hidden_size, device=cfg.device, dtype=cfg.dtype) for _ in c.feature_layers]
    nxt = torch.randint(0, c.vocab_size, (b, rows), device=cfg.device)
    return aux, nxt


def head_step_eager(head: Any, kind: str, cfg: Settings, b: int) -> float:
    """Median wall ms of one drafting step as HeadDrafter.propose runs it: per request the
    committed rows' features gathered from the aux states and `extend`, one batched `draft`,
    top-k and the host copy of the top-k (which the tree builders read as numpy)."""
    commit = cfg.commit_rows
    feats_ctx = torch.randn(cfg.context - commit, len(head.config.feature_layers) * head.config.hidden_size,
                            device=cfg.device, dtype=cfg.dtype)
    base = [head.extend(head.new_cache(), feats_ctx,
                        torch.randint(0, head.config.vocab_size, (feats_ctx.shape[0],), device=cfg.device))
            for _ in range(b)]
    aux, nxt = _committed_inputs(head, cfg, b, commit)
    host_tokens = nxt.cpu().numpy()

    def step() -> None:
        caches = []
        for i in range(b):
            idx = torch.as_tensor(np.arange(i * commit, (i + 1) * commit)).to(cfg.device)
            feats = torch.cat([a[idx] for a in aux], -1).to(cfg.dtype)
            tokens = torch.as_tensor(host_tokens[i]).to(cfg.device)
            caches.append(head.extend(base[i], feats, tokens))
        top = torch.topk(head.draft(caches), HEAD_TOPK[kind], dim=-1)
        top.indices.cpu(), top.values.cpu()

    def fresh() -> None:                                # new committed tokens, as the host holds them
        host_tokens[:] = np.random.randint(0, head.config.vocab_size, host_tokens.shape)

    for _ in range(2):
        step()
    return time_eager(step, cfg.device, cfg.reps, fresh)


@dataclass
class HeadCore:
    """A head's drafting arithmetic over fixed-shape inputs, ready for graph capture: fn() runs
    it, refresh() draws fresh tokens; past (per layer K/V [b, kv, context, D]), feats and nxt
    are the static inputs (tests fill them from a real cache to compare with `draft`)."""
    fn: Callable[[], Any]
    refresh: Callable[[], None]
    past: list[tuple[torch.Tensor, torch.Tensor]]
    feats: torch.Tensor
    nxt: torch.Tensor


def dart_core(head: Any, cfg: Settings, b: int) -> HeadCore:
    """DART's draft arithmetic over a padded fixed-shape cache (DartHead.draft's mask and
    positions, the commit rows' K/V written into the cache's last slots), for graph capture."""
    c, commit, n = head.config, cfg.commit_rows, cfg.context
    m = c.mask_rows
    pk = torch.randn(b, c.num_kv_heads, n, c.head_dim, device=cfg.device, dtype=cfg.dtype)
    pv = torch.randn_like(pk)
    aux, nxt = _committed_inputs(head, cfg, b, commit)
    feats = torch.cat(aux, -1).view(b, commit, -1)
    pos_commit = torch.arange(n - commit, n, device=cfg.device)
    pos = torch.arange(n - 1, n + m, device=cfg.device).expand(b, -1)
    mask = torch.zeros(b, 1 + m, n + 1 + m, dtype=torch.bool, device=cfg.device)
    mask[:, :, :n] = True
    block = torch.ones(m, m, dtype=torch.bool, device=cfg.device)
    mask[:, 1:, n + 1:] = block.tril() if c.within_block == "causal" else block

    def core() -> Any:
        z = head.inputs(feats, nxt)
        k, v = head.layer.self_attn.keys_values(head.layer.input_layernorm(z), pos_commit)
        pk[:, :, n - commit:], pv[:, :, n - commit:] = k, v
        x = torch.cat([z[:, -1:], head.mask_embed.expand(b, -1, -1)], 1)
        logits = head._logits(head.layer(x, pos, mask, past=(pk, pv)))
        return torch.topk(torch.log_softmax(logits.float(), -1), HEAD_TOPK["dart"], dim=-1)

    return HeadCore(core, lambda: nxt.random_(0, c.vocab_size), [(pk, pv)], feats, nxt)


def jetspec_core(head: Any, kind: str, cfg: Settings, b: int) -> HeadCore:
    """JetSpec's (or the diffusion head's) draft arithmetic over fixed-shape context K/V
    (JetSpecHead.draft's mask and positions, the commit rows' context K/V written per layer)."""
    c, commit, n = head.config, cfg.commit_rows, cfg.context
    past = [(torch.randn(b, c.num_kv_heads, n, c.head_dim, device=cfg.device, dtype=cfg.dtype),
             torch.randn(b, c.num_kv_heads, n, c.head_dim, device=cfg.device, dtype=cfg.dtype))
            for _ in range(c.num_layers)]
    aux, nxt = _committed_inputs(head, cfg, b, commit)
    feats = torch.cat(aux, -1).view(b, commit, -1)
    pos_commit = torch.arange(n - commit, n, device=cfg.device)
    pos = (n + torch.arange(c.depth + 1, device=cfg.device)).expand(b, -1)
    mask = torch.cat([torch.ones(b, c.depth + 1, n, dtype=torch.bool, device=cfg.device),
                      head._block_mask(cfg.device).expand(b, -1, -1)], -1)

    def core() -> Any:
        for (pk, pv), (k, v) in zip(past, head._context_kv(feats, pos_commit)):
            pk[:, :, n - commit:], pv[:, :, n - commit:] = k, v
        x = head._block_inputs(nxt[:, -1])
        logits = head._logits(head._run(x, pos, mask, past)[:, 1:])
        return torch.topk(torch.log_softmax(logits.float(), -1), HEAD_TOPK[kind], dim=-1)

    return HeadCore(core, lambda: nxt.random_(0, c.vocab_size), past, feats, nxt)


def measure_heads(cfg: Settings, target: LlamaShape, embed: torch.Tensor) -> dict[str, Any]:
    """Per head kind and B: the eager drafter step and the graph-captured core."""
    out: dict[str, Any] = {}
    for kind, config in head_configs(target).items():
        entry: dict[str, Any] = {"config": {k: (list(v) if isinstance(v, tuple) else v)
                                            for k, v in asdict(config).items()},
                                 "topk": HEAD_TOPK[kind], "commit_rows": cfg.commit_rows, "results": []}
        holder: dict[str, Any] = {}
        _measure(holder, cfg.budget, lambda: {"head": build_head(kind, config, embed, cfg.device, cfg.dtype)})
        head = holder.get("head")
        if head is None:
            entry["error"] = holder.get("error", "not built")
            out[kind] = entry
            continue
        entry["params_without_embedding"] = sum(p.numel() for name, p in head.named_parameters()
                                                if not name.startswith("embed."))
        for b in cfg.batches:
            rec: dict[str, Any] = {"batch": b}
            _measure(rec, cfg.budget, lambda b=b: {"step_eager_ms": head_step_eager(head, kind, cfg, b)})
            graph_rec: dict[str, Any] = {}

            def graph(b: int = b) -> dict[str, Any]:
                core = dart_core(head, cfg, b) if kind == "dart" else jetspec_core(head, kind, cfg, b)
                ms, method = time_graph(core.fn, cfg.device, cfg.reps, core.refresh)
                return {"core_graph_ms": ms, "timing": method}

            _measure(graph_rec, cfg.budget, graph)
            rec.update(graph_rec if "error" not in graph_rec else {"core_error": graph_rec["error"]})
            entry["results"].append(rec)
        out[kind] = entry
        head = None                                    # free this head before building the next
        holder.clear()
        if cfg.device.type == "cuda":
            torch.cuda.empty_cache()
    return out


# -- driver ---------------------------------------------------------------------------------

def _versions(device: torch.device) -> dict[str, Any]:
    def version(pkg: str) -> str | None:
        try:
            return importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            return None

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu"
    return {"device": str(device), "device_name": name, "torch": torch.__version__,
            "cuda": torch.version.cuda, "triton": version("triton"), "numpy": np.__version__,
            "python": platform.python_version(), "platform": platform.platform()}


def _errors(node: Any, path: str = "") -> list[str]:
    """Every recorded error in the result tree, with where it happened."""
    if isinstance(node, dict):
        own = [f"{path}: {v}" for k, v in node.items() if k in ("error", "core_error")]
        return own + [e for k, v in node.items() for e in _errors(v, f"{path}.{k}")]
    if isinstance(node, list):
        return [e for i, v in enumerate(node) for e in _errors(v, f"{path}[{i}]")]
    return []


def _section(result: dict[str, Any], name: str, fn: Callable[[], dict[str, Any]]) -> None:
    """result[name] = fn(), or {"error": ...} when a whole section fails (setup, OOM): the
    other sections still run and the JSON is still written."""
    try:
        result[name] = fn()
    except Exception as e:                              # noqa: BLE001 - recorded in the JSON
        result[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def run(cfg: Settings, save: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """All measurements; target first (the curve everything else is compared with). `save` gets
    the partial result after each section, so a run killed by an outer timeout keeps what it
    measured."""
    target, draft = (TINY_TARGET, TINY_DRAFT) if cfg.tiny else (TARGET_8B, DRAFT_LM)
    torch.manual_seed(0)
    result: dict[str, Any] = {"benchmark": "gpu_forward_costs", **_versions(cfg.device),
                              "dtype": str(cfg.dtype).replace("torch.", ""), "tiny": cfg.tiny,
                              "context": cfg.context, "batches": list(cfg.batches), "rows": list(cfg.rows),
                              "parts": list(cfg.parts), "budget_s": cfg.budget.seconds}
    try:
        attention, tries = pick_attention(cfg.device, cfg.dtype, target.heads, target.kv_heads, target.head_dim)
        draft_attention, _ = pick_attention(cfg.device, cfg.dtype, draft.heads, draft.kv_heads, draft.head_dim)
    except Exception as e:                              # noqa: BLE001 - nothing valid to time; say why
        result.update(errors=[f"attention: {type(e).__name__}: {e}"[:800]], vllm_imported=vllm_imported_here(),
                      elapsed_s=round(time.monotonic() - cfg.budget.start, 2))
        return result
    result["method"] = {
        "weights": "randn * 0.02 drawn on the device (RMSNorm weights 1; heads: their own random init); "
                   "KV caches randn",
        "inputs": "fresh random token ids before every timed run",
        "graph_timing": "CUDA graph per shape, warm-up on a side stream, replays timed with CUDA events, median"
                        if cfg.device.type == "cuda" else "no CUDA graphs on cpu: eager wall clock",
        "eager_timing": "wall clock with device synchronize, median",
        "attention": attention.kind, "attention_tries": tries, "draft_lm_attention": draft_attention.kind,
        "attention_semantics": "n new rows attend the cache + new rows, lower-right causal (no tree mask: "
                               "a tree mask only removes work)",
        "reps": cfg.reps, "eager_reps": cfg.eager_reps}
    shared: dict[str, Any] = {}

    def target_part() -> dict[str, Any]:
        tgt = measure_target(cfg, target, attention)
        shared["embed"] = tgt.pop("embed")
        return {"shape": asdict(target), "params": target.params(), "results": tgt["results"]}

    def heads_part() -> dict[str, Any]:
        embed = shared.pop("embed", None)
        if embed is None:                               # target skipped or failed: the heads need one
            embed = _randn((target.vocab, target.hidden), cfg.device, cfg.dtype)
        return measure_heads(cfg, target, embed)

    def draft_part() -> dict[str, Any]:
        return {"shape": asdict(draft), "params": draft.params(), "chain_ks": list(cfg.chain_ks),
                "results": measure_draft_lm(cfg, draft, draft_attention)}

    with torch.inference_mode():
        for name, part in (("target", target_part), ("heads", heads_part), ("draft_lm", draft_part)):
            if name in cfg.parts:
                _section(result, name, part)
                if cfg.device.type == "cuda":
                    torch.cuda.empty_cache()
                _finish(result, cfg)
                if save is not None:
                    save(result)
    shared.clear()
    return _finish(result, cfg)


def _vllm_loaded() -> frozenset[str]:
    return frozenset(m for m in sys.modules if m == "vllm" or m.startswith("vllm."))


_VLLM_BEFORE = _vllm_loaded()   # reset by main(): a test process may have loaded vLLM already


def vllm_imported_here() -> bool:
    """Whether this script loaded a vLLM module (a test process may have loaded vLLM before)."""
    return bool(_vllm_loaded() - _VLLM_BEFORE)


def _finish(result: dict[str, Any], cfg: Settings) -> dict[str, Any]:
    """The summary fields (errors so far, elapsed time, peak memory, the no-vLLM check)."""
    result["errors"] = _errors({k: result[k] for k in ("target", "heads", "draft_lm") if k in result})
    result["elapsed_s"] = round(time.monotonic() - cfg.budget.start, 2)
    if cfg.device.type == "cuda":
        result["max_memory_allocated_gib"] = round(torch.cuda.max_memory_allocated(cfg.device) / 2**30, 2)
    result["vllm_imported"] = vllm_imported_here()
    return result


def print_table(result: dict[str, Any]) -> None:
    """The numbers a reader wants first: target ms per (B, n), head and draft-LM ms per B."""
    def fmt(x: Any) -> str:
        return f"{x:8.3f}" if isinstance(x, (int, float)) else f"{'err':>8s}"

    print(f"{result['device_name']} | torch {result['torch']} | attention "
          f"{result.get('method', {}).get('attention')} | context {result['context']} | {result['elapsed_s']} s")
    target, heads, draft = (result.get(k) or {} for k in ("target", "heads", "draft_lm"))
    print(f"{'target B':>8s} {'n':>4s} {'graph ms':>8s} {'eager ms':>8s}")
    for r in target.get("results", []):
        print(f"{r['batch']:8d} {r['rows']:4d} {fmt(r.get('graph_ms'))} {fmt(r.get('eager_ms'))}")
    print(f"{'head':>10s} {'B':>3s} {'step eager':>10s} {'core graph':>10s}")
    for kind, entry in heads.items():
        for r in entry.get("results", []) if isinstance(entry, dict) else []:
            print(f"{kind:>10s} {r['batch']:3d}   {fmt(r.get('step_eager_ms'))}   {fmt(r.get('core_graph_ms'))}")
    print(f"{'draft LM B':>10s} {'fwd graph':>9s} {'fwd eager':>9s}  chains (graph ms)")
    for r in draft.get("results", []):
        chains = " ".join(f"k={k}:{v:.3f}" if isinstance(v, float) else f"k={k}:err"
                          for k, v in r.get("chain_graph_ms", {}).items())
        print(f"{r['batch']:10d} {fmt(r.get('forward_graph_ms'))}  {fmt(r.get('forward_eager_ms'))}  {chains}")
    if result["errors"]:
        print(f"{len(result['errors'])} measurement(s) failed:", *result["errors"], sep="\n  ")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="directory for gpu_forward_costs.json")
    p.add_argument("--device", default="cuda")
    p.add_argument("--tiny", action="store_true", help="tiny shapes (CI smoke on a CPU)")
    p.add_argument("--context", type=int, default=None, help="KV context rows per request (1024; tiny 64)")
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64, 128])
    p.add_argument("--chain-ks", type=int, nargs="+", default=[4, 6, 8, 12, 16])
    p.add_argument("--commit-rows", type=int, default=3,
                   help="rows a request commits per step (about tau) that the head's extend ingests")
    p.add_argument("--reps", type=int, default=None, help="timed replays per shape (20; tiny 3)")
    p.add_argument("--eager-reps", type=int, default=None, help="eager runs per shape (3; tiny 1)")
    p.add_argument("--parts", nargs="+", choices=["target", "heads", "draft_lm"],
                   default=["target", "heads", "draft_lm"], help="what to measure (default: all)")
    p.add_argument("--budget-s", type=float, default=100.0,
                   help="wall-clock guard from start: later measurements are skipped and recorded")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    global _VLLM_BEFORE
    _VLLM_BEFORE = _vllm_loaded()
    ns = parse_args(argv)
    budget = Budget(ns.budget_s)
    device = torch.device(ns.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device (use --device cpu --tiny for the smoke run)")
    cfg = Settings(device=device, dtype=torch.bfloat16, tiny=ns.tiny,
                   context=ns.context or (64 if ns.tiny else 1024), batches=tuple(ns.batches),
                   rows=tuple(ns.rows), chain_ks=tuple(ns.chain_ks), commit_rows=ns.commit_rows,
                   reps=ns.reps or (3 if ns.tiny else 20), eager_reps=ns.eager_reps or (1 if ns.tiny else 3),
                   budget=budget, parts=tuple(ns.parts))
    if cfg.commit_rows < 1 or cfg.commit_rows >= cfg.context:
        raise SystemExit("--commit-rows must be in [1, context)")
    ns.out.mkdir(parents=True, exist_ok=True)
    path = ns.out / "gpu_forward_costs.json"

    def save(result: dict[str, Any]) -> None:
        path.write_text(json.dumps(result, indent=1) + "\n")

    result = run(cfg, save)
    save(result)
    print_table(result)
    print(f"wrote {path}")
    assert not vllm_imported_here(), "gpu_forward_costs must not import vllm"
    return 0


if __name__ == "__main__":
    sys.exit(main())
