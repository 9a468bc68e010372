"""Mamba / Mamba-2 draft model runtime (the `DraftLM` interface; no vLLM imports).

A recurrent model needs no KV cache and no tree attention: a request's whole past is one fixed
size state per layer (a short convolution window plus the SSM state), so the per-token drafting
cost does not grow with the context. Tree drafting follows the Mamba-drafters paper (Choi et al.,
sec. 4.1): a tree node's state is ONE recurrent step from its parent's state, so all frontier
nodes of all requests at one depth are one batched single-token step, and the states live in
buffers preallocated for `max_requests` slots x `max_tree_nodes` nodes ("batch generation with
preallocated state caches"), so drafting never allocates per branch.

State layout, per layer: ``conv[slot * max_tree_nodes + node]`` holds the last ``conv_kernel - 1``
inputs of the depthwise causal convolution and ``ssm[slot * max_tree_nodes + node]`` the SSM
state (Mamba: [intermediate, state]; Mamba-2: [heads, head_dim, state]), both float32. Node 0 of
a slot is the request's committed state (after its last committed token, the step tree's root);
`extend` writes nodes 1, 2, ... of the current step and never touches node 0, so the next
`start_step` catches up from node 0.

`start_step` feeds each request only the tokens committed since the previous step, and fewer when
the previous step's tree holds them: the deepest tree node on the newly committed tokens (the
accepted draft path) already has the state after them, so it is copied to node 0 and only the
rest (usually just the bonus token) is fed; siblings and deeper nodes are discarded (their
buffer rows are overwritten by the next extends). Recurrent states cannot rewind, so a context
that is not an extension of the consumed tokens (preemption, a reused request id) is recomputed
from the zero state; an unchanged context reuses the stored log-probs without a forward.
Catch-ups are batched: rows are grouped by new-token count (each group padded to its longest
row, at most twice any member's count), one-token rows take the recurrent step, longer ones the
parallel scan (Mamba-2: the chunked SSD form; Mamba: a log-depth parallel scan) in chunks of
`prefill_chunk` tokens. Padding is exact: padded positions get
``dt = 0``, which makes the SSM update the identity (``exp(0 * A) = 1``, ``dt * B * x = 0``).

The math is a functional re-implementation over the Hugging Face modules' own parameters and
submodules (embedding, norms, in/out projections, conv weights, A_log, D, dt bias, gated norm,
lm head); tests/test_mamba_draft_lm.py checks every path against a fresh full forward of the HF
model.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from vllm_treespec.drafters.lm.base import DraftModelError
from vllm_treespec.drafters.lm.slots import SlotOwner, SlotTable

__all__ = ["MambaDraftLM", "SUPPORTED_ARCHITECTURES", "load_hf_mamba", "state_bytes_per_request"]

SUPPORTED_ARCHITECTURES = ("MambaForCausalLM", "Mamba2ForCausalLM")
DEFAULT_MAX_STATE_BYTES = 4 << 30


def _segsum(x: torch.Tensor) -> torch.Tensor:
    """[..., T] -> [..., T, T]: out[i, j] = sum(x[j+1 .. i]) for j <= i, -inf above the diagonal."""
    t = x.shape[-1]
    x = x[..., None].expand(*x.shape, t)
    x = x.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device), -1), 0)
    out = torch.cumsum(x, dim=-2)
    return out.masked_fill(~torch.tril(torch.ones(t, t, dtype=torch.bool, device=x.device), 0), -torch.inf)


def _ssd_scan(x, dt, a, b, c, h0, chunk: int):
    """Mamba-2 chunked SSD scan with an initial state (the structured-state-space-duality form).

    x [n, T, h, p], dt [n, T, h] (after softplus/clamp/padding mask), a [h] (negative), b and c
    [n, T, h, s] (groups already expanded to heads), h0 [n, h, p, s]. Returns the SSM output
    y [n, T, h, p] (without the D skip) and the final state [n, h, p, s]. Padding up to a whole
    chunk uses dt = 0, i.e. identity steps.
    """
    n, t = x.shape[:2]
    pad = (-t) % chunk
    if pad:
        x, dt, b, c = (F.pad(v, (0, 0) * (v.dim() - 2) + (0, pad)) for v in (x, dt, b, c))
    nc = (t + pad) // chunk
    xs = (x * dt[..., None]).reshape(n, nc, chunk, *x.shape[2:])                 # b c l h p
    la = (dt * a).reshape(n, nc, chunk, -1).permute(0, 3, 1, 2)                  # b h c l
    b = b.reshape(n, nc, chunk, *b.shape[2:])                                     # b c l h s
    c = c.reshape(n, nc, chunk, *c.shape[2:])
    la_cum = torch.cumsum(la, dim=-1)
    # 1. within-chunk (diagonal blocks)
    decay = torch.exp(_segsum(la))                                                # b h c l s
    scores = torch.einsum("bclhn,bcshn->bhcls", c, b) * decay
    y = torch.einsum("bhcls,bcshp->bclhp", scores, xs)
    # 2. each chunk's contribution to the state at its end
    decay_to_end = torch.exp(la_cum[..., -1:] - la_cum)                           # b h c l
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", b, decay_to_end, xs)
    # 3. state at every chunk boundary (inter-chunk recurrence, starting from h0)
    states = torch.cat([h0[:, None], states], dim=1)
    decay_chunk = torch.exp(_segsum(F.pad(la_cum[..., -1], (1, 0))))              # b h z z
    states = torch.einsum("bhzc,bchpn->bzhpn", decay_chunk, states)
    start_states, final = states[:, :-1], states[:, -1]
    # 4. contribution of each chunk's start state to its outputs
    y = y + torch.einsum("bclhn,bchpn,bhcl->bclhp", c, start_states, torch.exp(la_cum))
    return y.reshape(n, nc * chunk, *y.shape[3:])[:, :t], final


def _parallel_scan(da: torch.Tensor, dbx: torch.Tensor, h0: torch.Tensor) -> torch.Tensor:
    """All states of h_t = da_t * h_{t-1} + dbx_t (dim 1 is time), by a log-depth Hillis-Steele scan."""
    dbx = torch.cat([(da[:, :1] * h0[:, None] + dbx[:, :1]), dbx[:, 1:]], dim=1)
    t, k = da.shape[1], 1
    while k < t:
        dbx = torch.cat([dbx[:, :k], dbx[:, k:] + da[:, k:] * dbx[:, :-k]], dim=1)
        if 2 * k < t:
            da = torch.cat([da[:, :k], da[:, k:] * da[:, :-k]], dim=1)
        k *= 2
    return dbx


def _state_shapes(model: torch.nn.Module) -> tuple[tuple[int, int], tuple[int, ...]]:
    """Per node and layer: the conv state [conv_dim, kernel - 1] and the SSM state shape."""
    mixer = model.backbone.layers[0].mixer
    conv = (mixer.conv1d.weight.shape[0], mixer.conv1d.weight.shape[-1] - 1)
    if type(model).__name__ == "Mamba2ForCausalLM":
        return conv, (mixer.num_heads, mixer.head_dim, mixer.ssm_state_size)
    return conv, (mixer.intermediate_size, mixer.ssm_state_size)


def state_bytes_per_node(model: torch.nn.Module) -> int:
    """float32 bytes of one tree node's recurrent state over all layers."""
    conv, ssm = _state_shapes(model)
    return 4 * len(model.backbone.layers) * (conv[0] * conv[1] + int(np.prod(ssm)))


def state_bytes_per_request(model: torch.nn.Module, max_tree_nodes: int) -> int:
    """What MambaDraftLM preallocates per cached request: root + tree node states and last log-probs."""
    return max_tree_nodes * state_bytes_per_node(model) + 4 * int(model.lm_head.out_features)


def load_hf_mamba(model_dir: Path | str, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """The HF Mamba / Mamba-2 model of a local directory (config.json + weights), weights as saved."""
    model_dir = Path(model_dir)
    cfg_path = model_dir / "config.json"
    if not cfg_path.is_file():
        raise DraftModelError(f"{model_dir}: no config.json, not a Hugging Face model directory")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as e:
        raise DraftModelError(f"{cfg_path}: not valid JSON ({e})") from None
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    if arch not in SUPPORTED_ARCHITECTURES:
        raise DraftModelError(
            f"{model_dir}: architecture {arch!r} (model_type {cfg.get('model_type')!r}) is not served by the "
            f"Mamba draft runtime, which supports {', '.join(SUPPORTED_ARCHITECTURES)}")
    import transformers

    hf_cls = getattr(transformers, arch)
    try:
        # rescale_prenorm_residual is an init-time option, but transformers 5.19 also applies it
        # to LOADED weights (out_proj /= sqrt(layers) in _init_weights), which would serve other
        # weights than the checkpoint's: always load with it off.
        return hf_cls.from_pretrained(str(model_dir), dtype=dtype, rescale_prenorm_residual=False)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise DraftModelError(f"{model_dir}: cannot load {arch}: {e}") from e


class MambaDraftLM(SlotOwner):
    """`DraftLM` runtime for Hugging Face `MambaForCausalLM` and `Mamba2ForCausalLM` models.

    Build it with `MambaDraftLM.load(model_dir, max_requests=..., max_tree_nodes=...)` or from an
    already loaded HF model with `MambaDraftLM(model, max_requests=..., max_tree_nodes=...)`.
    Single-threaded; tensors stay on the model's device, returned log-probs are float32 on the CPU.
    """

    def __init__(self, model: torch.nn.Module, *, max_requests: int, max_tree_nodes: int,
                 max_state_bytes: int = DEFAULT_MAX_STATE_BYTES, prefill_chunk: int = 256,
                 ssd_chunk: int = 64) -> None:
        name = type(model).__name__
        if name not in SUPPORTED_ARCHITECTURES:
            raise DraftModelError(
                f"the Mamba draft runtime serves {' and '.join(SUPPORTED_ARCHITECTURES)} models, not {name}; "
                "transformer draft models (Llama, Qwen3, ...) need the transformer runtime")
        if int(max_requests) < 1:
            raise DraftModelError(f"max_requests must be at least 1, got {max_requests}")
        if int(max_tree_nodes) < 1:
            raise DraftModelError(f"max_tree_nodes must be at least 1 (the root), got {max_tree_nodes}")
        if prefill_chunk < 1 or ssd_chunk < 1:
            raise DraftModelError(f"prefill_chunk and ssd_chunk must be positive, got {prefill_chunk}, {ssd_chunk}")
        self.model = model.eval()
        self.config = config = model.config
        self.is_mamba2 = name == "Mamba2ForCausalLM"
        archs = getattr(config, "architectures", None) or [name]
        self.architecture: str = archs[0]
        self.max_requests = int(max_requests)
        self.max_tree_nodes = int(max_tree_nodes)
        self.prefill_chunk = int(prefill_chunk)
        self.ssd_chunk = int(ssd_chunk)
        self._backbone = model.backbone
        self._layers = list(model.backbone.layers)
        self.vocab_size: int = int(model.lm_head.out_features)
        self.device = model.lm_head.weight.device
        self.dtype = model.lm_head.weight.dtype
        self._residual_fp32 = bool(getattr(config, "residual_in_fp32", True))
        self._check_config()

        (self._conv_dim, self._conv_width), ssm_shape = _state_shapes(model)
        rows = self.max_requests * self.max_tree_nodes
        per_node = state_bytes_per_node(model)
        self.state_bytes = self.max_requests * state_bytes_per_request(model, self.max_tree_nodes)
        if self.state_bytes > max_state_bytes:
            raise DraftModelError(
                f"{self.architecture}: {self.max_requests} requests x {self.max_tree_nodes} tree nodes need "
                f"{self.state_bytes / 2**30:.2f} GiB of preallocated recurrent state ({per_node / 2**20:.2f} MiB "
                f"per node), above max_state_bytes={max_state_bytes}; lower max_requests or max_tree_nodes")
        kw = {"dtype": torch.float32, "device": self.device}
        self._conv = [torch.zeros(rows, self._conv_dim, self._conv_width, **kw) for _ in self._layers]
        self._ssm = [torch.zeros(rows, *ssm_shape, **kw) for _ in self._layers]
        self._last_logp = torch.zeros(self.max_requests, self.vocab_size, dtype=torch.float32)

        self.slots = SlotTable(self.max_requests)   # owners (LRU), consumed tokens, generations
        # each slot's latest step tree (node 0 = root): lets the next start_step resume from the
        # state of the deepest tree node on the newly committed tokens instead of re-feeding them
        self._tree_tok = np.zeros((self.max_requests, self.max_tree_nodes), np.int64)
        self._tree_par = np.full((self.max_requests, self.max_tree_nodes), -1, np.int64)
        self._tree_size = np.zeros(self.max_requests, np.int64)   # last tree (read once tokens are consumed)
        # the current step (set by start_step)
        self._step_slots = np.zeros(0, np.int64)
        self._step_gens = np.zeros(0, np.int64)
        self._step_next = np.zeros(0, np.int64)

    # ------------------------------------------------------------------ construction

    @classmethod
    def load(cls, model_dir: Path | str, *, max_requests: int, max_tree_nodes: int,
             dtype: torch.dtype = torch.float32, device: str | torch.device = "cpu", **kwargs) -> "MambaDraftLM":
        """Load a local HF Mamba / Mamba-2 model directory (config.json + weights)."""
        model = load_hf_mamba(model_dir, dtype)
        return cls(model.to(device), max_requests=max_requests, max_tree_nodes=max_tree_nodes, **kwargs)

    def _check_config(self) -> None:
        cfg = self.config
        for layer in self._layers:
            mixer = layer.mixer
            if self.is_mamba2:
                if mixer.num_heads % mixer.n_groups:
                    raise DraftModelError(f"{self.architecture}: num_heads={mixer.num_heads} is not a multiple "
                                          f"of n_groups={mixer.n_groups}")
                if mixer.num_heads * mixer.head_dim != mixer.intermediate_size:
                    raise DraftModelError(f"{self.architecture}: num_heads * head_dim != expand * hidden_size")
            else:
                missing = [a for a in ("x_proj", "dt_proj", "A_log", "D", "conv1d", "in_proj", "out_proj")
                           if not hasattr(mixer, a)]
                if missing:
                    raise DraftModelError(f"{self.architecture}: unexpected Mamba mixer without {missing}")
                if mixer.A_log.shape != (mixer.intermediate_size, mixer.ssm_state_size):
                    raise DraftModelError(f"{self.architecture}: A_log of shape {tuple(mixer.A_log.shape)} "
                                          "is not [intermediate_size, state_size]")
            if getattr(mixer, "layer_type", "linear_attention") not in ("linear_attention", "mamba", None):
                raise DraftModelError(f"{self.architecture}: layer type {mixer.layer_type!r} is not a Mamba layer")
        if getattr(cfg, "conv_kernel", 1) < 1:
            raise DraftModelError(f"{self.architecture}: conv_kernel must be at least 1")

    # ------------------------------------------------------------------ step

    @torch.inference_mode()
    def start_step(self, req_ids: Sequence[str], contexts: Sequence[np.ndarray]) -> torch.Tensor:
        """Resync every request's state to its context (root last); log-probs [B, V] after each root."""
        if len(req_ids) != len(contexts):
            raise ValueError(f"{len(req_ids)} request ids but {len(contexts)} contexts")
        if len(set(req_ids)) != len(req_ids):
            raise ValueError("a request id appears twice in one step")
        slots = np.empty(len(req_ids), np.int64)
        checked: list[np.ndarray] = []
        for i, (rid, ctx) in enumerate(zip(req_ids, contexts)):   # validate everything before any change
            slot = self.slots.slot(rid)
            if slot is None:
                raise ValueError(f"request {rid!r} holds no cache slot: pass only requests admit() accepted")
            ctx = self._check_tokens(np.asarray(ctx), f"context of request {rid!r}").reshape(-1)
            if ctx.size == 0:
                raise ValueError(f"request {rid!r}: empty context (the root token is the context's last token)")
            slots[i] = slot
            checked.append(ctx)
        todo: list[tuple[int, np.ndarray]] = []      # (row, tokens to feed)
        resume: list[tuple[int, int]] = []           # (slot, tree node whose state becomes node 0)
        for i, ctx in enumerate(checked):
            slot = int(slots[i])
            done = self.slots.consumed[slot]
            if done.size and self.slots.reuse(slot, ctx) == done.size:
                if done.size < ctx.size:
                    node, depth = self._tree_match(slot, ctx[done.size:ctx.size - 1])
                    if depth:
                        resume.append((slot, node))
                        self.slots.record(slot, ctx[:done.size + depth])
                    todo.append((i, ctx))
            else:                                        # fresh, or not an extension: from the zero state
                self.slots.record(slot, ctx[:0])
                todo.append((i, ctx))
            self._tree_size[slot] = 1
        if resume:
            src = torch.tensor([s * self.max_tree_nodes + n for s, n in resume], device=self.device)
            dst = torch.tensor([s * self.max_tree_nodes for s, _ in resume], device=self.device)
            for buf in (*self._conv, *self._ssm):
                buf.index_copy_(0, dst, buf.index_select(0, src))
        # group by new-token count: sorted descending, a group's padded length is at most twice any member's
        todo.sort(key=lambda item: item[1].size - self.slots.length(slots[item[0]]), reverse=True)
        group: list[tuple[int, np.ndarray]] = []
        for item in todo:
            new = item[1].size - self.slots.length(slots[item[0]])
            if group and 2 * new < group[0][1].size - self.slots.length(slots[group[0][0]]):
                self._catch_up(group, slots)
                group = []
            group.append(item)
        if group:
            self._catch_up(group, slots)
        self._step_slots = slots
        self._step_gens = self.slots.generation[slots].copy()
        self._step_next = np.ones(len(req_ids), np.int64)
        return self._last_logp[torch.from_numpy(slots)].clone()

    def _tree_match(self, slot: int, tokens: np.ndarray) -> tuple[int, int]:
        """Deepest node of the slot's last step tree on the path `tokens` from its root: (node, depth)."""
        size = int(self._tree_size[slot])
        par, tok = self._tree_par[slot, :size], self._tree_tok[slot, :size]
        node = depth = 0
        for t in tokens:
            child = np.flatnonzero((par == node) & (tok == t))
            if child.size == 0:
                break
            node, depth = int(child[0]), depth + 1
        return node, depth

    def _catch_up(self, group: list[tuple[int, np.ndarray]], slots: np.ndarray) -> None:
        """Feed each row its unconsumed tokens from its committed state (node 0) in one padded batch."""
        rows = [slots[i] for i, _ in group]
        starts = [self.slots.length(s) for s in rows]
        lens = [ctx.size - st for (_, ctx), st in zip(group, starts)]
        width = max(lens)
        tokens = np.zeros((len(group), width), np.int64)
        for r, ((_, ctx), st) in enumerate(zip(group, starts)):
            tokens[r, :ctx.size - st] = ctx[st:]
        slot_t = torch.tensor(rows, dtype=torch.long)
        node0 = (slot_t * self.max_tree_nodes).to(self.device)
        fresh = torch.tensor([st == 0 for st in starts], device=self.device)
        conv = [torch.where(fresh[:, None, None], 0.0, c.index_select(0, node0)) for c in self._conv]
        ssm = [torch.where(fresh.view(-1, *([1] * (s.dim() - 1))), 0.0, s.index_select(0, node0)) for s in self._ssm]
        lens_t = torch.tensor(lens, dtype=torch.long, device=self.device)
        tok_t = torch.from_numpy(tokens).to(self.device)
        last_hidden = torch.empty(len(group), self.config.hidden_size, dtype=torch.float32, device=self.device)
        for t0 in range(0, width, self.prefill_chunk):
            active = (lens_t > t0).nonzero().flatten()
            if active.numel() == 0:
                break
            chunk_len = min(self.prefill_chunk, width - t0)
            sub_lens = (lens_t[active] - t0).clamp(max=chunk_len)
            sub_conv = [c[active] for c in conv]
            sub_ssm = [s[active] for s in ssm]
            hidden = self._forward(tok_t[active, t0:t0 + chunk_len], sub_lens, sub_conv, sub_ssm)
            for c, sc in zip(conv, sub_conv):
                c[active] = sc
            for s, ss in zip(ssm, sub_ssm):
                s[active] = ss
            ends = (lens_t[active] <= t0 + chunk_len).nonzero().flatten()  # rows whose last token is here
            last_hidden[active[ends]] = hidden[ends, sub_lens[ends] - 1].float()
        for c, buf in zip(conv, self._conv):
            buf.index_copy_(0, node0, c)
        for s, buf in zip(ssm, self._ssm):
            buf.index_copy_(0, node0, s)
        self._last_logp[slot_t] = self._log_probs(last_hidden).cpu()
        for (_, ctx), slot in zip(group, rows):
            self.slots.record(slot, ctx)

    @torch.inference_mode()
    def extend(self, req_index: np.ndarray, parent: np.ndarray, tokens: np.ndarray) -> torch.Tensor:
        """Add tree nodes (row of this step's req_ids, parent node id, token): one batched recurrent
        step from each parent's state; log-probs [n, V] after each new node."""
        req_index = np.asarray(req_index, dtype=np.int64).reshape(-1)
        parent = np.asarray(parent, dtype=np.int64).reshape(-1)
        tokens = self._check_tokens(np.asarray(tokens), "extend tokens").reshape(-1)
        n = req_index.size
        if parent.size != n or tokens.size != n:
            raise ValueError(f"extend: req_index, parent and tokens differ in length "
                             f"({n}, {parent.size}, {tokens.size})")
        if n == 0:
            return torch.empty(0, self.vocab_size, dtype=torch.float32)
        rows = self._step_slots.size
        if req_index.min() < 0 or req_index.max() >= rows:
            raise ValueError(f"extend: req_index out of range for the {rows} requests of this step")
        slots = self._step_slots[req_index]
        if np.any(self.slots.generation[slots] != self._step_gens[req_index]):
            raise ValueError("extend: a request lost its cache slot since start_step (released or evicted)")
        if parent.min() < 0 or np.any(parent >= self._step_next[req_index]):
            bad = int(np.flatnonzero((parent < 0) | (parent >= self._step_next[req_index]))[0])
            raise ValueError(f"extend: node {bad} names parent {parent[bad]}, which request row "
                             f"{req_index[bad]} does not have yet (parents must exist before the call)")
        # new ids: the next free ids of each request, in call order
        order = np.argsort(req_index, kind="stable")
        sorted_rows = req_index[order]
        first = np.searchsorted(sorted_rows, sorted_rows, side="left")
        rank = np.empty(n, np.int64)
        rank[order] = np.arange(n) - first
        new_ids = self._step_next[req_index] + rank
        if new_ids.max() >= self.max_tree_nodes:
            bad = int(np.argmax(new_ids >= self.max_tree_nodes))
            raise ValueError(f"extend: request row {req_index[bad]} would exceed max_tree_nodes="
                             f"{self.max_tree_nodes} (root included)")
        np.maximum.at(self._step_next, req_index, new_ids + 1)
        self._tree_tok[slots, new_ids] = tokens
        self._tree_par[slots, new_ids] = parent
        np.maximum.at(self._tree_size, slots, new_ids + 1)
        src = torch.from_numpy(slots * self.max_tree_nodes + parent).to(self.device)
        dst = torch.from_numpy(slots * self.max_tree_nodes + new_ids).to(self.device)
        conv = [c.index_select(0, src) for c in self._conv]
        ssm = [s.index_select(0, src) for s in self._ssm]
        hidden = self._forward(torch.from_numpy(tokens).to(self.device)[:, None], None, conv, ssm)
        for c, buf in zip(conv, self._conv):
            buf.index_copy_(0, dst, c)
        for s, buf in zip(ssm, self._ssm):
            buf.index_copy_(0, dst, s)
        return self._log_probs(hidden[:, 0]).cpu()

    def _check_tokens(self, arr: np.ndarray, what: str) -> np.ndarray:
        if arr.dtype.kind not in "iu":
            raise ValueError(f"{what}: token ids must be integers, got dtype {arr.dtype}")
        arr = arr.astype(np.int64, copy=False)
        if arr.size and (arr.min() < 0 or arr.max() >= self.vocab_size):
            raise ValueError(f"{what}: token id outside the draft vocabulary [0, {self.vocab_size})")
        return arr

    # ------------------------------------------------------------------ model math

    def _log_probs(self, hidden: torch.Tensor) -> torch.Tensor:
        h = self._backbone.norm_f(hidden)
        logits = self.model.lm_head(h.to(self.model.lm_head.weight.dtype)).float()
        return torch.log_softmax(logits, dim=-1)

    def _forward(self, tokens: torch.Tensor, lens: torch.Tensor | None,
                 conv: list[torch.Tensor], ssm: list[torch.Tensor]) -> torch.Tensor:
        """Run [n, T] tokens from the given per-layer states, updating `conv`/`ssm` in place (list
        entries are replaced) to the states after each row's `lens` tokens (all T when None).
        Returns the final hidden states [n, T, H] before the last norm (padded positions: garbage)."""
        h = self._backbone.embeddings(tokens)
        if self._residual_fp32:
            h = h.float()
        t = tokens.shape[1]
        valid = None if lens is None else (torch.arange(t, device=tokens.device)[None, :] < lens[:, None])
        for li, layer in enumerate(self._layers):
            x = layer.norm(h.to(layer.norm.weight.dtype))
            mix = self._mamba2_mixer if self.is_mamba2 else self._mamba1_mixer
            out, conv[li], ssm[li] = mix(layer.mixer, x, lens, valid, conv[li], ssm[li])
            h = h + out
        return h

    def _conv_step(self, mixer, x: torch.Tensor, lens: torch.Tensor | None, state: torch.Tensor):
        """Causal depthwise conv of x [n, C, T] continuing from `state` [n, C, K-1]; returns the activated
        output [n, C, T] and the new state (the K-1 inputs before each row's end)."""
        full = torch.cat([state.to(x.dtype), x], dim=-1)
        y = F.conv1d(full, mixer.conv1d.weight, mixer.conv1d.bias, groups=full.shape[1])
        w = self._conv_width
        if lens is None:
            new_state = full[..., full.shape[-1] - w:]
        else:
            idx = (lens[:, None] + torch.arange(w, device=x.device)[None, :])[:, None, :].expand(-1, full.shape[1], -1)
            new_state = full.gather(2, idx)
        return mixer.act(y), new_state.float()

    def _mamba1_mixer(self, mixer, hidden, lens, valid, conv_state, ssm_state):
        dtype = hidden.dtype
        x, gate = mixer.in_proj(hidden).transpose(1, 2).chunk(2, dim=1)          # [n, I, T] each
        x, conv_state = self._conv_step(mixer, x, lens, conv_state)
        x = x.transpose(1, 2)                                                     # [n, T, I]
        dt, b, c = torch.split(mixer.x_proj(x), [mixer.time_step_rank, mixer.ssm_state_size,
                                                 mixer.ssm_state_size], dim=-1)
        dt = F.softplus(mixer.dt_proj(dt).float())                                # [n, T, I]
        if valid is not None:
            dt = dt * valid[..., None]
        a = -torch.exp(mixer.A_log.float())                                       # [I, S]
        da = torch.exp(dt[..., None] * a)                                         # [n, T, I, S]
        dbx = (dt * x.float())[..., None] * b.float()[:, :, None, :]
        if x.shape[1] == 1:
            states = da * ssm_state[:, None] + dbx
        else:
            states = _parallel_scan(da, dbx, ssm_state)
        y = (states @ c.float()[..., None]).squeeze(-1)                           # [n, T, I]
        y = y + x.float() * mixer.D.float()
        y = y * F.silu(gate.transpose(1, 2).float())
        return mixer.out_proj(y.to(dtype)), conv_state, states[:, -1]

    def _mamba2_mixer(self, mixer, hidden, lens, valid, conv_state, ssm_state):
        dtype = hidden.dtype
        n, t, _ = hidden.shape
        heads, head_dim, s, groups = mixer.num_heads, mixer.head_dim, mixer.ssm_state_size, mixer.n_groups
        gate, xbc, dt = mixer.in_proj(hidden).split([mixer.intermediate_size, mixer.conv_dim, heads], dim=-1)
        xbc, conv_state = self._conv_step(mixer, xbc.transpose(1, 2), lens, conv_state)
        x, b, c = torch.split(xbc.transpose(1, 2), [mixer.intermediate_size, groups * s, groups * s], dim=-1)
        x = x.reshape(n, t, heads, head_dim).float()
        b = b.reshape(n, t, groups, s).float().repeat_interleave(heads // groups, dim=2)
        c = c.reshape(n, t, groups, s).float().repeat_interleave(heads // groups, dim=2)
        dt = F.softplus(dt.float() + mixer.dt_bias.float())                      # [n, T, H]
        lo, hi = mixer.time_step_limit
        if lo > 0.0 or hi != float("inf"):
            dt = dt.clamp(min=lo, max=hi)
        if valid is not None:
            dt = dt * valid[..., None]
        a = -torch.exp(mixer.A_log.float())                                       # [H]
        if t == 1:
            da = torch.exp(dt[:, 0] * a)                                          # [n, H]
            ssm_state = ssm_state * da[..., None, None] + \
                (dt[:, 0, :, None] * x[:, 0])[..., None] * b[:, 0, :, None, :]
            y = torch.einsum("nhps,nhs->nhp", ssm_state, c[:, 0])[:, None]
        else:
            y, ssm_state = _ssd_scan(x, dt, a, b, c, ssm_state, self.ssd_chunk)
        y = y + x * mixer.D.float()[:, None]
        y = mixer.norm(y.reshape(n, t, -1), gate)
        return mixer.out_proj(y.to(dtype)), conv_state, ssm_state
