"""Slow float64 references for the tree-attention tests (read nothing from the fast path).

The cache is read one slot at a time with the element formulas written out from vLLM's
csrc/cpu/cpu_attn_{vec,amx}.hpp, and visibility comes from walking ``parents``, so neither the
layout description in cpu_kv_layout nor the ancestor bitmask is trusted here. The caches
themselves (block tables, the key/value split) come from benchmarks/harness/paged_cache.py.
"""
from __future__ import annotations

import torch

from vllm_treespec.attention.cpu_kv_layout import slot_element_offsets

__all__ = ["poisoned_cache", "logical_slots", "write_slots", "read_slot_reference",
           "tree_attention_reference"]


def poisoned_cache(num_blocks: int, num_kv_heads: int, block_size: int, head_size: int,
                   dtype: torch.dtype) -> torch.Tensor:
    """A layer cache full of NaN, so any read of a slot nobody wrote shows up in the output."""
    return torch.full((num_blocks, num_kv_heads, block_size, 2 * head_size), float("nan"),
                      dtype=dtype)


def logical_slots(block_table_row: torch.Tensor, positions: torch.Tensor, block_size: int
                  ) -> torch.Tensor:
    """int64 slot of each logical position of one request."""
    positions = positions.to(torch.int64)
    return block_table_row.to(torch.int64)[positions // block_size] * block_size \
        + positions % block_size


def write_slots(kv_cache: torch.Tensor, slots: torch.Tensor, key: torch.Tensor,
                value: torch.Tensor, layout: str) -> None:
    """Store key/value [M, Hkv, D] at `slots` (what vLLM's reshape_and_cache does, in torch)."""
    _, hkv, bs, d2 = kv_cache.shape
    idx = slot_element_offsets(slots, layout, hkv, bs, d2 // 2)
    flat = kv_cache.view(-1)
    flat[idx[:, :, 0].flatten()] = key.to(kv_cache.dtype).flatten()
    flat[idx[:, :, 1].flatten()] = value.to(kv_cache.dtype).flatten()


def read_slot_reference(key_cache: torch.Tensor, value_cache: torch.Tensor, slot: int,
                        layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V ``[Hkv, D]`` of one slot, straight from the per-element formulas."""
    _, hkv, bs, dim = key_cache.shape
    blk, o = divmod(int(slot), bs)
    kraw = key_cache[blk].reshape(hkv, bs * dim)       # each head's bs*D elements, memory order
    vraw = value_cache[blk].reshape(hkv, bs * dim)
    d = torch.arange(dim)
    if layout == "token_major":
        k_idx, v_idx = o * dim + d, o * dim + d
    elif layout in ("vec", "vec16"):
        k_idx, v_idx = d * bs + o, o * dim + d
    elif layout == "amx":
        k_idx = (o // 16) * 16 * dim + (d // 2) * 32 + (o % 16) * 2 + d % 2
        v_idx = (d // 16) * (bs * 16) + (o // 2) * 32 + (d % 16) * 2 + o % 2
    else:
        raise NotImplementedError(layout)
    return kraw[:, k_idx], vraw[:, v_idx]


def tree_attention_reference(query: torch.Tensor, key_cache: torch.Tensor,
                             value_cache: torch.Tensor, block_table: torch.Tensor,
                             prefix_lens: torch.Tensor, offsets: torch.Tensor,
                             parents: torch.Tensor, scale: float, *, layout: str,
                             logits_soft_cap: float | None = None) -> torch.Tensor:
    """float64 ``[T, Hq, D]``: per request, per node, per head, dense visibility from parents."""
    t, hq, dim = query.shape
    bs, hkv = key_cache.shape[2], key_cache.shape[1]
    group = hq // hkv
    out = torch.full((t, hq, dim), float("nan"), dtype=torch.float64)
    for r in range(offsets.numel() - 1):
        start, stop = int(offsets[r]), int(offsets[r + 1])
        prefix = int(prefix_lens[r])
        keys, values = [], []
        for p in range(prefix + stop - start):
            slot = int(block_table[r, p // bs]) * bs + p % bs
            k, v = read_slot_reference(key_cache, value_cache, slot, layout)
            keys.append(k.double())
            values.append(v.double())
        keys_all, values_all = torch.stack(keys), torch.stack(values)     # [L, Hkv, D]
        for i in range(stop - start):
            visible = list(range(prefix))
            node = i
            while node >= 0:                                # self, parent, ..., root
                visible.append(prefix + node)
                node = int(parents[start + node])
            for h in range(hq):
                kk = keys_all[visible, h // group]
                vv = values_all[visible, h // group]
                s = kk @ query[start + i, h].double() * scale
                if logits_soft_cap:
                    s = logits_soft_cap * torch.tanh(s / logits_soft_cap)
                out[start + i, h] = torch.softmax(s, dim=0) @ vv
    return out
