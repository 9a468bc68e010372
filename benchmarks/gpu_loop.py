"""Engine-free greedy decoding loop: is tree speculative decoding through the package's GPU
verification kernels lossless on a real model, and how many tokens/s does it give?

Runs without vLLM (it never imports it, and fails loudly if anything did). A minimal Qwen3
forward in plain torch (the code-LM fixture: fp32, 3 layers, tied embeddings) runs every step's
attention through ``kernels.tree_attention.paged_tree_attention`` over a paged KV cache in vLLM's
layout ``[num_blocks, 16, Hkv, D]`` with shuffled block tables. Modes, over one batch of prompts:

  plain      one causal decode row per request per step; next tokens stay on the device (no
             host sync until the end): the baseline a tree must beat
  tree       lookup-trie drafter (C++ core, on the host) -> one verify forward over all tree
             rows -> ``kernels.tree_accept.greedy_tree_accept`` -> ``kernels.kv_compaction``
             of the accepted path -> only the emitted token ids go back to the host
  tree-cuda  the same with the CUDA extension's accept and compaction ops (when built)

Every tree mode's tokens are compared with plain's: in float32 (TF32 off) they must be equal
token for token; a mismatch records the request, position, both tokens and plain's top-2 logit
gap there. ``--dtype bfloat16`` adds a second, reported-only run. Tokens/s are decode-phase
wall clock (synchronised) after a warm-up run of the same mode that compiles the Triton kernels.
EOS is ignored: every request generates exactly ``--max-new-tokens``.

    python benchmarks/gpu_loop.py --model DIR --trie FILE --prompts prompts.json --out OUT
    python benchmarks/gpu_loop.py --device cpu --tiny --out OUT       # CPU interpreter, ~10 s

``--device cpu`` runs the Triton kernels in the interpreter (TRITON_INTERPRET=1, set here before
triton is imported): tiny settings only, for tests. Writes OUT/gpu_loop.json; exit 0 when every
float32 tree mode equals plain, 1 when one differs or failed, 2 when vLLM was imported.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import importlib.util
import json
import os
import platform
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

BLOCK_SIZE = 16
# Settings when not given on the command line: a real run, and --tiny (CPU interpreter, CI).
FULL = {"batch": 8, "max_new_tokens": 128, "budget": 16, "depth": 8, "warmup": 1}
TINY = {"batch": 2, "max_new_tokens": 8, "budget": 8, "depth": 4, "warmup": 0}

# Prompts when no --prompts file is given (tokenised with the model's tokenizer.json).
CODE_PROMPTS = [
    "import os\nimport sys\n\n\ndef main(argv):\n    parser = argparse.ArgumentParser()\n"
    "    parser.add_argument('--verbose', action='store_true')\n"
    "    args = parser.parse_args(argv)\n",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
    "        self.items.append(item)\n\n    def pop(self):\n",
    "def read_lines(path):\n    with open(path) as f:\n        for line in f:\n"
    "            line = line.strip()\n            if not line:\n                continue\n",
    "    def __repr__(self):\n        return '%s(%r)' % (self.__class__.__name__, self.name)\n\n"
    "    def __eq__(self, other):\n        if not isinstance(other, self.__class__):\n",
]


# ---------------------------------------------------------------------------- setup
def prepare_triton(device: str) -> None:
    """Triton reads TRITON_INTERPRET when it is first imported (harness/triton_mode.py), so the CPU
    interpreter must be chosen before any kernel module loads."""
    if device == "cpu":
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise RuntimeError("triton was imported before TRITON_INTERPRET=1 was set")
        os.environ["TRITON_INTERPRET"] = "1"
        from harness.triton_mode import triton_mode_problem

        problem = triton_mode_problem()
        if problem:
            raise RuntimeError(problem)


def set_exact_math() -> None:
    """The float32 equality check needs IEEE matmuls: TF32 would blur near-ties."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.set_float32_matmul_precision("highest")


def _vllm_loaded() -> set[str]:
    return {m for m in sys.modules if m == "vllm" or m.startswith("vllm.")}


_VLLM_BEFORE = frozenset(_vllm_loaded())   # reset by main(): a test process may have loaded vLLM already


def vllm_modules() -> list[str]:
    """vLLM modules this script loaded (the loop must run without vLLM)."""
    return sorted(_vllm_loaded() - _VLLM_BEFORE)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------- model
@dataclasses.dataclass
class Qwen3:
    """Qwen3ForCausalLM weights on the device (q/k/v and gate/up fused per layer)."""
    embed: torch.Tensor                 # [V, H], also the LM head (tied)
    norm: torch.Tensor
    layers: list[dict[str, torch.Tensor]]
    cos: torch.Tensor                   # [max_pos, D] float32 RoPE tables
    sin: torch.Tensor
    num_heads: int
    num_kv_heads: int
    head_dim: int
    eps: float

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device


def load_model(model_dir: str | Path, device: str | torch.device = "cuda",
               dtype: torch.dtype = torch.float32, max_positions: int = 4096) -> Qwen3:
    """The checkpoint's config.json + model.safetensors (a Qwen3 with tied embeddings)."""
    from safetensors.torch import load_file

    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text())
    if not cfg.get("tie_word_embeddings", False):
        raise NotImplementedError("only tied embeddings (the code-LM fixture)")
    w = load_file(str(model_dir / "model.safetensors"))
    dev = torch.device(device)
    put = lambda t: t.to(device=dev, dtype=dtype).contiguous()  # noqa: E731
    layers = []
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        a = p + "self_attn."
        layers.append({
            "input_norm": put(w[p + "input_layernorm.weight"]),
            "post_norm": put(w[p + "post_attention_layernorm.weight"]),
            "qkv": put(torch.cat([w[a + "q_proj.weight"], w[a + "k_proj.weight"],
                                  w[a + "v_proj.weight"]])),
            "q_norm": put(w[a + "q_norm.weight"]),
            "k_norm": put(w[a + "k_norm.weight"]),
            "o": put(w[a + "o_proj.weight"]),
            "gate_up": put(torch.cat([w[p + "mlp.gate_proj.weight"], w[p + "mlp.up_proj.weight"]])),
            "down": put(w[p + "mlp.down_proj.weight"]),
        })
    d = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    theta = (cfg.get("rope_parameters") or {}).get("rope_theta") or cfg.get("rope_theta", 10000.0)
    # as transformers' default RoPE: inv_freq from int64 arange, angles in float32
    inv_freq = 1.0 / (theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    ang = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat([ang, ang], dim=-1)
    return Qwen3(put(w["model.embed_tokens.weight"]), put(w["model.norm.weight"]), layers,
                 emb.cos().to(dev), emb.sin().to(dev), cfg["num_attention_heads"],
                 cfg["num_key_value_heads"], d, float(cfg["rms_norm_eps"]))


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """Qwen3RMSNorm: statistics in float32, scaled in the input dtype."""
    h = x.float()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return weight * h.to(x.dtype)


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE; cos/sin are [T, 1, D] in x's dtype."""
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


# ---------------------------------------------------------------------------- paged cache
@dataclasses.dataclass
class PagedKV:
    """Per-layer K and V caches ``[num_blocks, 16, Hkv, D]`` and a shuffled block table."""
    keys: list[torch.Tensor]
    values: list[torch.Tensor]
    block_table: torch.Tensor           # int32 [B, blocks_per_request], device
    table_host: np.ndarray              # the same, on the host (slot mapping)

    def slots(self, req: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Flat cache slot of logical position ``pos`` of request ``req`` (vectorised)."""
        blk = self.table_host[req, pos // BLOCK_SIZE].astype(np.int64)
        return blk * BLOCK_SIZE + pos % BLOCK_SIZE


def new_paged_kv(model: Qwen3, num_requests: int, max_len: int, seed: int = 0) -> PagedKV:
    """NaN-filled caches (a read of a slot nobody wrote poisons the logits) with every
    request's blocks scattered over the pool, plus spare blocks nobody owns."""
    per_req = -(-max_len // BLOCK_SIZE)
    num_blocks = num_requests * per_req + 5
    gen = torch.Generator().manual_seed(seed)
    table = torch.randperm(num_blocks, generator=gen)[: num_requests * per_req]
    table = table.view(num_requests, per_req).to(torch.int32)
    shape = (num_blocks, BLOCK_SIZE, model.num_kv_heads, model.head_dim)
    nan = [torch.full(shape, float("nan"), dtype=model.dtype, device=model.device)
           for _ in range(2 * len(model.layers))]
    return PagedKV(nan[0::2], nan[1::2],
                   table.to(model.device), table.numpy())


# ---------------------------------------------------------------------------- one forward
@dataclasses.dataclass
class Step:
    """One forward's rows: flat tokens of B requests (tree nodes, decode rows or prompts)."""
    tokens: torch.Tensor                # int64 [T]
    positions: torch.Tensor             # int64 [T] RoPE positions
    slots: torch.Tensor                 # int64 [T] cache slot each row's K/V is written to
    req_ids: torch.Tensor               # int64 [B] block-table rows
    prefix_lens: torch.Tensor           # int64 [B] committed tokens before the rows
    q_offsets: torch.Tensor             # int64 [B+1]
    anc_mask: torch.Tensor              # int64 [T, W] (not read for causal requests)
    causal: torch.Tensor | None         # int64 [B] or None (tree rows)
    parents: torch.Tensor | None        # int64 [T] local parents (tree steps)
    max_rows: int
    max_prefix: int


def packed_step(device: torch.device, *, tokens: np.ndarray, positions: np.ndarray,
                slots: np.ndarray, req_ids: np.ndarray, prefix_lens: np.ndarray,
                q_offsets: np.ndarray, anc_mask: np.ndarray, causal: bool,
                parents: np.ndarray | None) -> Step:
    """A Step from host arrays in one host-to-device copy (one int64 buffer, sliced there)."""
    t, b = len(tokens), len(req_ids)
    parts = [tokens, positions, slots, req_ids, prefix_lens, q_offsets, anc_mask.reshape(-1)]
    if causal:
        parts.append(np.ones(b, dtype=np.int64))
    if parents is not None:
        parts.append(parents)
    host = torch.from_numpy(np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]))
    if device.type == "cuda":
        host = host.pin_memory()
    buf = host.to(device, non_blocking=True)
    out, at = [], 0
    for n in (t, t, t, b, b, b + 1, anc_mask.size):
        out.append(buf[at:at + n])
        at += n
    cz = buf[at:at + b] if causal else None
    at += b if causal else 0
    par = buf[at:at + t] if parents is not None else None
    sizes = np.diff(q_offsets)
    return Step(*out[:6], out[6].view(anc_mask.shape), cz, par,
                int(sizes.max()) if b else 0, int(np.max(prefix_lens)) if b else 0)


def forward(model: Qwen3, kv: PagedKV, step: Step, rows: torch.Tensor | None = None
            ) -> torch.Tensor:
    """Logits [T or len(rows), V]; writes every row's K/V to its slot first, then attends
    through the package's paged tree-attention kernel."""
    from vllm_treespec.kernels.tree_attention import paged_tree_attention

    f = torch.nn.functional
    t = step.tokens.shape[0]
    hq, hkv, d = model.num_heads, model.num_kv_heads, model.head_dim
    cos = model.cos[step.positions].to(model.dtype)[:, None, :]
    sin = model.sin[step.positions].to(model.dtype)[:, None, :]
    table = kv.block_table.index_select(0, step.req_ids)
    h = model.embed[step.tokens]
    for i, lw in enumerate(model.layers):
        x = rms_norm(h, lw["input_norm"], model.eps)
        q, k, v = f.linear(x, lw["qkv"]).split([hq * d, hkv * d, hkv * d], dim=-1)
        q = rope(rms_norm(q.view(t, hq, d), lw["q_norm"], model.eps), cos, sin)
        k = rope(rms_norm(k.view(t, hkv, d), lw["k_norm"], model.eps), cos, sin)
        kv.keys[i].view(-1, hkv, d).index_copy_(0, step.slots, k)
        kv.values[i].view(-1, hkv, d).index_copy_(0, step.slots, v.reshape(t, hkv, d))
        o = paged_tree_attention(q.contiguous(), kv.keys[i], kv.values[i], table,
                                 step.prefix_lens, step.q_offsets, step.anc_mask, d ** -0.5,
                                 causal=step.causal, max_rows=step.max_rows,
                                 max_prefix=step.max_prefix)
        h = h + f.linear(o.view(t, hq * d), lw["o"])
        x = rms_norm(h, lw["post_norm"], model.eps)
        gate, up = f.linear(x, lw["gate_up"]).chunk(2, dim=-1)
        h = h + f.linear(f.silu(gate) * up, lw["down"])
    if rows is not None:
        h = h[rows]
    return f.linear(rms_norm(h, model.norm, model.eps), model.embed)


def prefill(model: Qwen3, kv: PagedKV, prompts: Sequence[Sequence[int]],
            all_rows: bool = False) -> torch.Tensor:
    """Every prompt in one causal forward; logits of each prompt's last row (or all rows)."""
    lens = np.array([len(p) for p in prompts], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    req = np.repeat(np.arange(len(prompts)), lens)
    pos = np.concatenate([np.arange(n) for n in lens])
    step = packed_step(model.device, tokens=np.concatenate([np.asarray(p) for p in prompts]),
                       positions=pos, slots=kv.slots(req, pos), req_ids=np.arange(len(prompts)),
                       prefix_lens=np.zeros(len(prompts), np.int64), q_offsets=offsets,
                       anc_mask=np.zeros((int(lens.sum()), 1), np.int64), causal=True,
                       parents=None)
    return forward(model, kv, step, None if all_rows else step.q_offsets[1:] - 1)


# ---------------------------------------------------------------------------- decoding modes
@dataclasses.dataclass
class RunResult:
    """One mode's generated tokens and counters (times in seconds)."""
    tokens: list[list[int]]
    prefill_s: float
    decode_s: float
    steps: int
    request_steps: int = 0              # sum over steps of the requests in the batch
    emitted: int = 0                    # tokens the steps emitted (before the length cut)
    draft_s: float = 0.0                # host: drafting, TreeBatch, step building, H2D issue
    accept_hist: dict[int, int] = dataclasses.field(default_factory=dict)
    gaps: list[list[float]] | None = None   # plain: top-2 logit gap at every position


def run_plain(model: Qwen3, prompts: Sequence[Sequence[int]], max_new: int,
              seed: int = 0) -> RunResult:
    """Greedy decoding one row per request per step. Positions and slots of every step are
    known up front (one copy); tokens stay on the device until the end."""
    dev, b = model.device, len(prompts)
    lens = np.array([len(p) for p in prompts], dtype=np.int64)
    kv = new_paged_kv(model, b, int(lens.max()) + max_new + 1, seed)
    sync(dev)
    t0 = time.perf_counter()
    logits = prefill(model, kv, prompts)
    out = torch.empty(b, max_new, dtype=torch.int64, device=dev)
    gaps = torch.empty(b, max_new, dtype=torch.float32, device=dev)
    _record(logits, out, gaps, 0)
    sync(dev)
    t1 = time.perf_counter()
    pos = lens[None, :] + np.arange(max_new - 1)[:, None]          # [steps, B]
    plan = _plain_plan(dev, kv, pos, b)
    for s in range(max_new - 1):
        st = dataclasses.replace(plan[s], tokens=out[:, s])
        _record(forward(model, kv, st), out, gaps, s + 1)
    sync(dev)
    t2 = time.perf_counter()
    return RunResult(out.cpu().tolist(), t1 - t0, t2 - t1, max_new - 1,
                     request_steps=b * (max_new - 1), emitted=b * (max_new - 1),
                     accept_hist={1: b * (max_new - 1)}, gaps=gaps.cpu().tolist())


def _plain_plan(dev: torch.device, kv: PagedKV, pos: np.ndarray, b: int) -> list[Step]:
    """Every decode step's rows (tokens filled in per step), built with one copy."""
    n = pos.shape[0]
    req = np.broadcast_to(np.arange(b), pos.shape)
    slots = kv.slots(req.reshape(-1), pos.reshape(-1)).reshape(pos.shape)
    host = torch.from_numpy(np.stack([pos, slots]).astype(np.int64))
    buf = host.to(dev)
    ids = torch.arange(b, device=dev)
    offsets = torch.arange(b + 1, device=dev)
    anc = torch.ones(b, 1, dtype=torch.int64, device=dev)
    causal = torch.ones(b, dtype=torch.int64, device=dev)
    return [Step(ids, buf[0, s], buf[1, s], ids, buf[0, s], offsets, anc, causal, None, 1,
                 int(pos[s].max())) for s in range(n)]


def _record(logits: torch.Tensor, out: torch.Tensor, gaps: torch.Tensor, col: int) -> None:
    """Argmax (as the tree modes pick, ties included) into out[:, col] and the top-2 logit gap
    (a tiny gap is a near-tie that rounding can flip)."""
    out[:, col] = logits.argmax(-1)
    top = logits.topk(2, dim=-1).values.float()
    gaps[:, col] = top[:, 0] - top[:, 1]


@dataclasses.dataclass
class TreeDrafter:
    """The package's lookup-trie drafter with this loop's fixed node budget."""
    drafter: Any                 # vllm_treespec.drafters.lookup_trie.LookupTrieDrafter
    budget: int
    tokenizer_check: str = ""

    @property
    def params(self) -> dict[str, Any]:
        return self.drafter.params

    def propose(self, buf: np.ndarray, rows: np.ndarray, num_tokens: np.ndarray) -> list[Any]:
        """One tree per request from its tokens so far (one C++ call for the batch)."""
        from vllm_treespec.drafters.base import DraftInputs

        inputs = DraftInputs(req_ids=[str(r) for r in rows.tolist()], token_ids=buf,
                             rows=rows.astype(np.int64), num_tokens=num_tokens.astype(np.int64),
                             budgets=np.full(len(rows), self.budget, dtype=np.int64))
        return self.drafter.propose(inputs).trees


def make_drafter(trie_path: str | Path, model_dir: str | Path, budget: int = 16,
                 max_depth: int = 8, chain: bool = False, **overrides: Any) -> TreeDrafter:
    """`LookupTrieDrafter` from the config defaults (the lookup-trie presets' values) and
    `overrides`, its trie checked against the model's tokenizer as the plugin loads it; without
    the `tokenizers` library (the fingerprint needs it) the check is skipped and says so."""
    from types import SimpleNamespace

    from vllm_treespec.config import LookupTrieConfig
    from vllm_treespec.drafters.lookup_trie import LookupTrieDrafter

    checked = _importable("tokenizers")
    config = LookupTrieConfig(type="lookup_trie", path=str(trie_path), **overrides)
    tree = SimpleNamespace(builder="chain" if chain else "best_first", max_depth=int(max_depth))
    drafter = LookupTrieDrafter(config, model_dir if checked else None, tree)
    return TreeDrafter(drafter, int(budget),
                       "fingerprint matched" if checked else "skipped (no tokenizers)")


def _importable(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ImportError:
        return False


def accept_ops(impl: str, max_nodes: int) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """(greedy_tree_accept, compact_kv) of the Triton kernels or the CUDA extension. The
    Triton accept gets the node bound, so it neither syncs nor recompiles per step."""
    if impl == "cuda":
        from vllm_treespec.kernels import cuda_ops

        return cuda_ops.greedy_tree_accept, cuda_ops.compact_kv
    from vllm_treespec.kernels.kv_compaction import compact_kv
    from vllm_treespec.kernels.tree_accept import greedy_tree_accept

    return functools.partial(greedy_tree_accept, max_nodes=max_nodes), compact_kv


def run_tree(model: Qwen3, prompts: Sequence[Sequence[int]], max_new: int,
             drafter: TreeDrafter, impl: str = "triton", seed: int = 0) -> RunResult:
    """Greedy tree speculative decoding: draft -> verify -> accept -> compact -> append."""
    from vllm_treespec.kernels.kv_compaction import KVLayers

    accept, compact = accept_ops(impl, drafter.budget + 1)
    dev, b = model.device, len(prompts)
    depth = int(drafter.params["max_depth"])
    lens = np.array([len(p) for p in prompts], dtype=np.int64)
    cap = int(lens.max()) + max_new + drafter.budget + 1
    kv = new_paged_kv(model, b, cap, seed)
    layers = KVLayers.from_caches([c for pair in zip(kv.keys, kv.values) for c in pair])
    buf = np.zeros((b, cap + depth + 1), dtype=np.int32)   # the drafter's token buffer
    for r, p in enumerate(prompts):
        buf[r, :len(p)] = p
    num = lens.copy()
    out: list[list[int]] = [[] for _ in range(b)]
    res = RunResult(out, 0.0, 0.0, 0)
    sync(dev)
    t0 = time.perf_counter()
    first = prefill(model, kv, prompts).argmax(-1).cpu().numpy()
    for r in range(b):
        _append(buf, num, out, r, first[r:r + 1])
    t1 = time.perf_counter()
    active = np.array([r for r in range(b) if len(out[r]) < max_new], dtype=np.int64)
    while len(active):
        d0 = time.perf_counter()
        step = _tree_step(dev, kv, drafter.propose(buf, active, num[active]), active, num)
        res.draft_s += time.perf_counter() - d0
        target = forward(model, kv, step).argmax(-1)
        emitted, nodes, count = accept(step.q_offsets, step.tokens, step.parents, target,
                                       depth + 1)
        src, dst = _slot_pairs(step, nodes)
        compact(layers, src, dst)
        host = torch.cat([emitted, count[:, None]], dim=1).cpu().numpy()
        for i, r in enumerate(active.tolist()):
            c = int(host[i, -1])
            res.accept_hist[c] = res.accept_hist.get(c, 0) + 1
            res.emitted += c
            _append(buf, num, out, r, host[i, :c])
        res.steps += 1
        res.request_steps += len(active)
        active = np.array([r for r in active.tolist() if len(out[r]) < max_new], dtype=np.int64)
    sync(dev)
    t2 = time.perf_counter()
    res.tokens = [o[:max_new] for o in out]
    res.prefill_s, res.decode_s = t1 - t0, t2 - t1
    return res


def _append(buf: np.ndarray, num: np.ndarray, out: list[list[int]], r: int,
            toks: np.ndarray) -> None:
    """Commit emitted tokens of request r (its cache then holds all but the last)."""
    n = len(toks)
    buf[r, num[r]:num[r] + n] = toks
    num[r] += n
    out[r].extend(int(x) for x in toks)


def _tree_step(dev: torch.device, kv: PagedKV, trees: list[Any], active: np.ndarray,
               num: np.ndarray) -> Step:
    """Verify rows: node i of request r at slot position prefix+i, RoPE position
    prefix+depth(i), prefix = the request's committed tokens (all but its root)."""
    from vllm_treespec.tree import TreeBatch
    from vllm_treespec.tree.ancestors import local_index

    tb = TreeBatch.from_trees(trees)
    offsets = tb.offsets.numpy()
    sizes = np.diff(offsets)
    prefix = num[active] - 1
    base = np.repeat(prefix, sizes)
    slots = kv.slots(np.repeat(active, sizes), base + local_index(sizes))
    return packed_step(dev, tokens=tb.tokens.numpy(), positions=base + tb.depth.numpy(),
                       slots=slots, req_ids=active, prefix_lens=prefix, q_offsets=offsets,
                       anc_mask=tb.anc_mask.numpy(), causal=False, parents=tb.parents.numpy())


def _slot_pairs(step: Step, nodes: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    from vllm_treespec.verify.slot_moves import slot_moves

    return slot_moves(step.slots, step.q_offsets, nodes)


# ---------------------------------------------------------------------------- comparison
def compare(plain: RunResult, other: RunResult) -> dict[str, Any]:
    """Token-for-token equality with plain; per request its first mismatch, with plain's top-2
    logit gap there (a tiny gap means a near-tie that rounding can flip)."""
    mismatches, matched = [], []
    for r, (a, b) in enumerate(zip(plain.tokens, other.tokens)):
        n = min(len(a), len(b))
        at = next((i for i in range(n) if a[i] != b[i]), None)
        if at is None and len(a) != len(b):
            at = n
        matched.append(len(a) if at is None else at)
        if at is not None:
            gap = plain.gaps[r][at] if plain.gaps is not None and at < len(a) else None
            mismatches.append({"request": r, "position": at,
                               "plain_token": a[at] if at < len(a) else None,
                               "token": b[at] if at < len(b) else None, "plain_top2_gap": gap})
    total = sum(len(a) for a in plain.tokens)
    return {"equal": not mismatches and len(plain.tokens) == len(other.tokens),
            "requests_equal": len(plain.tokens) - len(mismatches),
            "matched_prefix_rate": sum(matched) / total if total else 1.0,
            "mismatches": mismatches}


def summarize(res: RunResult) -> dict[str, Any]:
    """A mode's JSON record: decode tokens/s (tokens after the prefill's first), tau, shares."""
    decode_tokens = sum(max(len(t) - 1, 0) for t in res.tokens)
    all_tokens = sum(len(t) for t in res.tokens)
    return {
        "tokens_per_s": decode_tokens / res.decode_s if res.decode_s > 0 else None,
        "e2e_tokens_per_s": (all_tokens / (res.prefill_s + res.decode_s)
                             if res.prefill_s + res.decode_s > 0 else None),
        "decode_s": res.decode_s, "prefill_s": res.prefill_s, "steps": res.steps,
        "tau": res.emitted / res.request_steps if res.request_steps else None,
        "draft_s": res.draft_s,
        "draft_share": res.draft_s / res.decode_s if res.decode_s > 0 else None,
        "accept_hist": {str(k): v for k, v in sorted(res.accept_hist.items())},
        "generated_tokens": all_tokens,
    }


def guarded(fn: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """A failing mode becomes an error record; the other modes still run."""
    try:
        return fn()
    except Exception as e:  # noqa: BLE001 - recorded in the JSON
        return {"error": f"{type(e).__name__}: {str(e)[:500]}",
                "traceback": traceback.format_exc()[-3000:]}


def run_mode(name: str, model: Qwen3, prompts: Sequence[Sequence[int]], max_new: int,
             drafter: TreeDrafter | None, warmup: int) -> RunResult:
    """Warm-up runs (Triton compiles) then the timed run of one mode."""
    def once() -> RunResult:
        if name == "plain":
            return run_plain(model, prompts, max_new)
        impl = "cuda" if name == "tree-cuda" else "triton"
        return run_tree(model, prompts, max_new, drafter, impl)

    for _ in range(warmup):
        once()
    return once()


def run_dtype(rec: dict[str, Any], model_dir: Path, dtype: torch.dtype, device: torch.device,
              prompts: list[list[int]], max_new: int, drafter: TreeDrafter | None,
              modes: Sequence[str], warmup: int, deadline: float,
              save: Callable[[], None] = lambda: None) -> None:
    """Every mode in one dtype into `rec`, plain first, each tree mode compared with it; the
    report is saved after every mode (a hard crash keeps what ran) and modes past `deadline`
    (perf_counter) are skipped."""
    max_pos = max(len(p) for p in prompts) + max_new + (drafter.budget if drafter else 0) + 8
    try:
        model = load_model(model_dir, device, dtype, max_positions=max(max_pos, 64))
    except Exception as e:  # noqa: BLE001 - recorded in the JSON
        rec["error"] = f"load_model: {type(e).__name__}: {e}"
        return
    plain: RunResult | None = None
    for name in modes:
        if time.perf_counter() > deadline:
            rec[name] = {"skipped": "time budget (--max-seconds) spent"}
            continue
        result: list[RunResult] = []

        def one(name: str = name) -> dict[str, Any]:
            result.append(run_mode(name, model, prompts, max_new, drafter, warmup))
            return summarize(result[0])
        rec[name] = guarded(one)
        if name == "plain":
            plain = result[0] if result else None
        elif result:
            _add_comparison(rec, name, plain, result[0])
        save()


def _add_comparison(rec: dict[str, Any], name: str, plain: RunResult | None,
                    res: RunResult) -> None:
    if plain is None:
        rec[name].update(equal=None, mismatches=[], note="no plain run to compare with")
        return
    rec[name].update(compare(plain, res))
    tps, base = rec[name]["tokens_per_s"], rec.get("plain", {}).get("tokens_per_s")
    rec[name]["speedup_vs_plain"] = tps / base if tps and base else None


# ---------------------------------------------------------------------------- inputs / output
def load_prompts(path: str | Path | None, model_dir: str | Path, batch: int) -> list[list[int]]:
    """A JSON list of token-id lists (bare, or under "prompts" as benchmarks/gpu_carry.py
    writes it), or the built-in code snippets tokenised; the first `batch` (cycled when fewer
    are given)."""
    if path is not None:
        data = json.loads(Path(path).read_text())
        if isinstance(data, dict):
            data = data["prompts"]
        prompts = [[int(t) for t in p] for p in data]
    else:
        prompts = tokenize_prompts(model_dir, CODE_PROMPTS)
    prompts = [p for p in prompts if p]
    if not prompts:
        raise ValueError("no non-empty prompts")
    return [prompts[i % len(prompts)] for i in range(batch)]


def tokenize_prompts(model_dir: str | Path, texts: Sequence[str]) -> list[list[int]]:
    """Token ids of `texts` with the model's tokenizer.json (no special tokens)."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(Path(model_dir) / "tokenizer.json"))
    return [tok.encode(t, add_special_tokens=False).ids for t in texts]


def environment(device: torch.device) -> dict[str, Any]:
    import triton

    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor()
    return {"device": name or platform.machine(), "torch": torch.__version__,
            "triton": triton.__version__, "python": platform.python_version(),
            "cuda": torch.version.cuda, "triton_interpret": os.environ.get("TRITON_INTERPRET")}


def cuda_ops_available(device: torch.device) -> bool:
    if device.type != "cuda":
        return False
    try:
        from vllm_treespec.kernels import cuda_ops

        return cuda_ops.available()
    except Exception:  # noqa: BLE001 - no extension is a skip, not a failure
        return False


def print_table(report: dict[str, Any]) -> None:
    cfg = report["config"]
    print(f"\n{report['env']['device']}  batch {cfg['batch']}  max_new {cfg['max_new_tokens']}  "
          f"budget {cfg['budget']}  depth {cfg['depth']}")
    print(f"{'dtype':9} {'mode':10} {'tok/s':>9} {'x plain':>8} {'tau':>6} {'steps':>6} "
          f"{'draft%':>7} {'equal':>6}")
    fmt = lambda x, f: "-" if x is None else format(x, f)  # noqa: E731
    for dtype, rec in report["runs"].items():
        if "error" in rec:
            print(f"{dtype:9} {'-':10} ERROR {rec['error'][:100]}")
        for mode, r in rec.items():
            if not isinstance(r, dict):
                continue
            if "tokens_per_s" not in r:
                print(f"{dtype:9} {mode:10} {(r.get('error') or r.get('skipped', '?'))[:100]}")
                continue
            eq = r.get("equal")
            eq_s = "-" if eq is None else "yes" if eq else f"{r['requests_equal']}/{cfg['batch']}"
            share = r.get("draft_share")
            print(f"{dtype:9} {mode:10} {fmt(r['tokens_per_s'], '9.1f')} "
                  f"{fmt(r.get('speedup_vs_plain'), '8.2f')} {fmt(r.get('tau'), '6.2f')} "
                  f"{r.get('steps', '-'):>6} {fmt(share and 100 * share, '7.1f')} {eq_s:>6}")


def verdict(report: dict[str, Any]) -> int:
    """0: every float32 tree mode equals plain; 1: one differs or failed; 2: vLLM imported."""
    if report["vllm_modules"]:
        return 2
    rec = report["runs"].get("float32", {})
    if "error" in rec or "error" in rec.get("plain", {}):
        return 1
    trees = [m for m in rec if m.startswith("tree")]
    return 0 if trees and all(rec[m].get("equal") is True for m in trees) else 1


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path,
                   help="Qwen3 checkpoint directory (default: the code-LM fixture)")
    p.add_argument("--trie", type=Path,
                   help="lookup-trie file (default: fixture code-lm-distill-5gram)")
    p.add_argument("--prompts", type=Path,
                   help="JSON list of token-id lists (default: built-in code snippets)")
    p.add_argument("--out", type=Path, required=True, help="writes OUT/gpu_loop.json")
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--tiny", action="store_true",
                   help=f"small defaults for the CPU interpreter: {TINY}")
    p.add_argument("--batch", type=int, help=f"requests decoded together ({FULL['batch']})")
    p.add_argument("--max-new-tokens", type=int, help=f"({FULL['max_new_tokens']})")
    p.add_argument("--budget", type=int,
                   help=f"draft nodes per request and step ({FULL['budget']})")
    p.add_argument("--depth", type=int, help=f"deepest tree level ({FULL['depth']})")
    p.add_argument("--chain", action="store_true", help="draft chains instead of best-first trees")
    p.add_argument("--min-path-prob", type=float, default=None,
                   help="drafter min_path_prob (default: the config default)")
    p.add_argument("--dtype", action="append", default=[], choices=["bfloat16"],
                   help="extra run in this dtype (float32 always runs: the equality check)")
    p.add_argument("--warmup", type=int, help=f"untimed runs per mode first ({FULL['warmup']})")
    p.add_argument("--modes", nargs="+", default=["plain", "tree", "tree-cuda"],
                   choices=["plain", "tree", "tree-cuda"], help="plain always runs first")
    p.add_argument("--max-seconds", type=float, default=75.0,
                   help="skip the modes left once this much time has passed (recorded)")
    ns = p.parse_args(argv)
    for key, value in (TINY if ns.tiny else FULL).items():
        if getattr(ns, key) is None:
            setattr(ns, key, value)
    return ns


def fixture_paths(model: Path | None, trie: Path | None) -> tuple[Path, Path]:
    """The code-LM fixture and its distilled trie where not given (cached; built when missing,
    which takes minutes): what tests/conftest.py's fixtures use."""
    if model is None:
        from treespec_fixtures import build_fixture

        model = build_fixture("code-lm")
    if trie is None:
        from treespec_fixtures.tries import build_trie_fixture

        trie = build_trie_fixture("code-lm-distill-5gram", model)
    return Path(model), Path(trie)


def main(argv: list[str] | None = None) -> int:
    global _VLLM_BEFORE
    _VLLM_BEFORE = frozenset(_vllm_loaded())
    ns = parse_args(argv)
    prepare_triton(ns.device)
    set_exact_math()
    device = torch.device(ns.device)
    report: dict[str, Any] = {"env": environment(device), "config": {
        "model": str(ns.model), "trie": str(ns.trie), "prompts": str(ns.prompts),
        "batch": ns.batch, "max_new_tokens": ns.max_new_tokens, "budget": ns.budget,
        "depth": ns.depth, "chain": ns.chain, "warmup": ns.warmup, "block_size": BLOCK_SIZE},
        "runs": {}}
    modes = ["plain", *[m for m in dict.fromkeys(ns.modes) if m != "plain"]]
    report["cuda_ops_available"] = cuda_ops_available(device)
    if "tree-cuda" in modes and not report["cuda_ops_available"]:
        modes.remove("tree-cuda")
        report["skipped"] = {"tree-cuda": "vllm_treespec._C_cuda not available"}
    prompts: list[list[int]] = []
    drafter = None
    try:
        ns.model, ns.trie = fixture_paths(ns.model, ns.trie)
        report["config"].update(model=str(ns.model), trie=str(ns.trie))
        prompts = load_prompts(ns.prompts, ns.model, ns.batch)
        report["config"]["prompt_lens"] = [len(p) for p in prompts]
        over = {} if ns.min_path_prob is None else {"min_path_prob": ns.min_path_prob}
        drafter = make_drafter(ns.trie, ns.model, ns.budget, ns.depth, ns.chain, **over)
        report["config"]["drafter"] = {**drafter.params, "tokenizer_check": drafter.tokenizer_check}
    except Exception as e:  # noqa: BLE001 - recorded in the JSON; plain still runs
        report["error"] = f"setup: {type(e).__name__}: {e}"
        report["traceback"] = traceback.format_exc()[-3000:]
    if drafter is None:
        modes = ["plain"]
    t0 = time.perf_counter()
    out_file = ns.out / "gpu_loop.json"
    ns.out.mkdir(parents=True, exist_ok=True)
    save = lambda: out_file.write_text(json.dumps(report, indent=1))  # noqa: E731
    for name in ["float32", *dict.fromkeys(ns.dtype)] if prompts else []:
        report["runs"][name] = {}
        run_dtype(report["runs"][name], ns.model, getattr(torch, name), device, prompts,
                  ns.max_new_tokens, drafter, modes, ns.warmup, t0 + ns.max_seconds, save)
    report["wall_s"] = time.perf_counter() - t0
    report["vllm_modules"] = vllm_modules()
    report["exit_code"] = code = verdict(report)
    save()
    print_table(report)
    if report["vllm_modules"]:
        print(f"FAIL: vLLM was imported: {report['vllm_modules'][:5]}", file=sys.stderr)
    print(f"wrote {out_file} (exit {code})")
    return code


if __name__ == "__main__":
    sys.exit(main())
