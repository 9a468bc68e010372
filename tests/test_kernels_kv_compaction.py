"""Triton KV compaction against the gather-then-scatter reference (CPU: interpreter).

Moves come from real acceptance (greedy walk over random trees with biased logits) through
verify.slot_moves.slot_moves, the one move rule the CPU and device paths share, checked here
against the rule written out per request; aliasing chains (every move's destination is the previous move's source)
are checked with chunk sizes that split them across chunks.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.paged_cache import random_block_table
from harness.kernel_reference import compact_kv_reference
from harness.triton_mode import triton_mode_problem
from vllm_treespec.verify import greedy_walk
from vllm_treespec.verify.slot_moves import listed_moves, slot_moves
from support.verify_cases import random_tree_batch

if (_why := triton_mode_problem()) is not None:
    pytest.skip(_why, allow_module_level=True)

from vllm_treespec.kernels.kv_compaction import KVLayers, compact_kv  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _random_caches(gen, layers, shape, dtype):
    """FlashAttention-style per-layer kv_cache [2, num_blocks, block_size, Hkv, D]."""
    x = [torch.randn((2, *shape), generator=gen) for _ in range(layers)]
    return [t.to(dtype).to(DEVICE) for t in x]


def _step(seed, sizes, prefixes, block_size, follow=0.9):
    """Trees, an accepted path per request, the rows' slot mapping (through a random block
    table) and the number of cache blocks."""
    rng = np.random.default_rng(seed)
    gen = torch.Generator().manual_seed(seed)
    tree = random_tree_batch(rng, sizes, vocab=6, max_children=2)
    logits = torch.randn(int(tree.offsets[-1]), 6, generator=gen)
    for i, par in enumerate(tree.parents.tolist()):     # argmax often on a child
        if par >= 0 and rng.random() < follow:
            start = int(tree.offsets[torch.searchsorted(tree.offsets, i, right=True) - 1])
            logits[start + par, tree.tokens[i]] += 5.0 + rng.random()
    res = greedy_walk(tree, logits, max(sizes))
    need = [-(-(p + n) // block_size) for p, n in zip(prefixes, sizes)]
    table = random_block_table(gen, need, sum(need) + 2, max(need) + 1)
    slot_mapping = torch.cat([
        table[r].to(torch.int64)[(p + torch.arange(n)) // block_size] * block_size
        + (p + torch.arange(n)) % block_size
        for r, (p, n) in enumerate(zip(prefixes, sizes))])
    return tree, res, slot_mapping, sum(need) + 2


def _moves_by_hand(slot_mapping, offsets, nodes):
    """The move rule written out: node i_j (column j - 1) of request r goes to node j's slot
    unless i_j == j; request order, j ascending."""
    src, dst = [], []
    for r, path in enumerate(nodes.tolist()):
        start = int(offsets[r])
        for j, node in enumerate(path, start=1):
            if node >= 0 and node != j:
                src.append(int(slot_mapping[start + node]))
                dst.append(int(slot_mapping[start + j]))
    return torch.tensor(src, dtype=torch.int64), torch.tensor(dst, dtype=torch.int64)


@pytest.mark.parametrize("seed,dtype,heads,d,block_size,block_j", [
    (0, torch.float16, 2, 8, 4, None),      # 8-byte words
    (1, torch.bfloat16, 3, 3, 8, 2),        # 6-byte rows: 2-byte words; chunks of 2 moves
    (2, torch.float32, 1, 16, 16, 1),       # one move per chunk
])
def test_matches_reference_on_accepted_paths(seed, dtype, heads, d, block_size, block_j):
    sizes, prefixes = [1, 12, 40, 7, 25], [0, 5, 17, 9, 30]
    tree, res, slot_mapping, num_blocks = _step(seed, sizes, prefixes, block_size)
    src, dst = slot_moves(slot_mapping.to(DEVICE), tree.offsets.to(DEVICE),
                          res.accepted_nodes.to(DEVICE))
    ref_src, ref_dst = _moves_by_hand(slot_mapping, tree.offsets, res.accepted_nodes)
    assert ref_src.numel() > 0
    # the device-side pairs are the rule's moves, padded per request; the host's list is theirs
    assert torch.equal(src[src >= 0].cpu(), ref_src) and torch.equal(dst[dst >= 0].cpu(), ref_dst)
    host = listed_moves(*slot_moves(slot_mapping, tree.offsets, res.accepted_nodes))
    assert torch.equal(host[0], ref_src) and torch.equal(host[1], ref_dst)

    gen = torch.Generator().manual_seed(seed)
    caches = _random_caches(gen, 3, (num_blocks, block_size, heads, d), dtype)
    want = [c.clone() for c in caches]
    compact_kv(KVLayers.from_caches(caches), src, dst, block_j=block_j)
    compact_kv_reference([v for c in want for v in c.unbind(0)], ref_src.to(DEVICE),
                         ref_dst.to(DEVICE))
    for got, exp in zip(caches, want):
        assert torch.equal(got, exp)             # moved slots and untouched ones, bitwise


@pytest.mark.parametrize("block_j", [1, 2, 4, 16])
def test_alias_chain_across_chunks(block_j):
    """Path nodes 2, 3, ..., 9 at depths 1..8: move j writes the slot move j+1 reads from."""
    gen = torch.Generator().manual_seed(3)
    nodes = torch.tensor([[2, 3, 4, 5, 6, 7, 8, 9, -1], [1, 3, 4, -1, -1, -1, -1, -1, -1]])
    offsets = torch.tensor([0, 10, 15])
    slot_mapping = torch.cat([torch.arange(3, 13), torch.arange(40, 45)])   # contiguous rows
    src, dst = slot_moves(slot_mapping, offsets, nodes)
    caches = _random_caches(gen, 2, (8, 8, 2, 4), torch.float16)
    before = [c.clone() for c in caches]
    compact_kv(KVLayers.from_caches(caches), src.to(DEVICE), dst.to(DEVICE), block_j=block_j)
    for got, old in zip(caches, before):
        flat_got, flat_old = got.flatten(1, 2), old.flatten(1, 2)   # [2, slots, Hkv, D]
        for j in range(1, 9):                                       # request 0: slot 3 + j
            assert torch.equal(flat_got[:, 3 + j], flat_old[:, 3 + j + 1])
        assert torch.equal(flat_got[:, 41], flat_old[:, 41])        # request 1: node 1 stays
        assert torch.equal(flat_got[:, 42], flat_old[:, 43])
        assert torch.equal(flat_got[:, 43], flat_old[:, 44])
        assert torch.equal(flat_got[:, 44], flat_old[:, 44])        # past the path: untouched


def test_strided_and_byte_caches():
    """HND-strided views (FlashInfer-style storage) and 1-byte elements with odd rows."""
    gen = torch.Generator().manual_seed(4)
    src = torch.tensor([[5, 9, -1], [21, 22, 23]], device=DEVICE)
    dst = torch.tensor([[4, 5, -1], [20, 21, 22]], device=DEVICE)
    hnd = [torch.randn(6, 3, 4, 8, generator=gen).to(DEVICE).permute(0, 2, 1, 3)
           for _ in range(4)]                                       # [nb, bs, Hkv, D] views
    odd = [torch.randint(0, 100, (2, 6, 4, 3, 5), generator=gen, dtype=torch.int8).to(DEVICE)
           for _ in range(2)]
    for caches, word in ((hnd, 8), (odd, 1)):
        layers = KVLayers.from_caches(caches)
        assert layers.word_bytes(8) == word
        want = [c.clone() for c in caches]
        compact_kv(layers, src, dst)
        compact_kv_reference([v for c in want for v in (c.unbind(0) if c.dim() == 5 else [c])],
                             src, dst)
        for got, exp in zip(caches, want):
            assert torch.equal(got, exp)


def test_rejects_mismatched_caches():
    a = torch.zeros(4, 4, 2, 8, device=DEVICE)
    with pytest.raises(ValueError, match="share"):
        KVLayers.from_caches([a, torch.zeros(4, 4, 2, 8, dtype=torch.float16, device=DEVICE)])
    with pytest.raises(ValueError, match="head dim"):
        KVLayers.from_caches([a.transpose(2, 3)])
    with pytest.raises(ValueError, match=r"\[B, W\]"):
        compact_kv(KVLayers.from_caches([a]), torch.zeros(3, dtype=torch.int64),
                   torch.zeros(3, dtype=torch.int64))
