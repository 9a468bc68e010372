"""KV compaction after tree acceptance leaves the cache a plain chain decode would have left.

The end-to-end check runs a toy multi-layer attention model with RoPE twice: once over the draft
trees (positions num_computed + depth, contiguous slots, tree attention), once over just the
accepted paths as chains (positions and slots num_computed + j). After compacting the tree run's
cache, every layer's K/V at the accepted positions must match the chain run's.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from harness.paged_cache import random_block_table, split_kv
from harness.random_trees import random_tree
from support.attention_reference import logical_slots, poisoned_cache, read_slot_reference, write_slots
from vllm_treespec.attention.tree_attention_cpu import gather_paged_kv, tree_attention
from vllm_treespec.tree import DraftTree, TreeBatch
from vllm_treespec.verify.kv_compaction import compact_kv
from vllm_treespec.verify.slot_moves import count_moves, listed_moves, node_moves, slot_moves


def accepted_slot_moves(offsets: torch.Tensor, accepted: torch.Tensor, num_computed: torch.Tensor,
                        table: torch.Tensor, block_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The host path's moves when node i of request r was written at position
    num_computed[r] + i of its block table (vLLM's contiguous slot mapping)."""
    sizes = (offsets[1:] - offsets[:-1]).tolist()
    slots = torch.cat([logical_slots(table[r], int(num_computed[r]) + torch.arange(n), block_size)
                       for r, n in enumerate(sizes)])
    return listed_moves(*slot_moves(slots, offsets, accepted))


def test_move_rule_by_hand():
    """Node i_j (column j - 1) goes to node j unless i_j == j; -1 where nothing moves."""
    nodes = torch.tensor([[2, 5, -1], [1, 2, -1], [1, 3, 4]])
    src, dst = node_moves(nodes)
    assert src.tolist() == [[2, 5, -1], [-1, -1, -1], [-1, 3, 4]]
    assert dst.tolist() == [[1, 2, -1], [-1, -1, -1], [-1, 2, 3]]
    assert count_moves(nodes) == count_moves(nodes.numpy()) == 4
    slots = torch.arange(100, 115)                     # rows 0-5, 6-8, 9-14
    s, d = slot_moves(slots, torch.tensor([0, 6, 9, 15]), nodes)
    assert s.tolist() == [[102, 105, -1], [-1, -1, -1], [-1, 112, 113]]
    assert d.tolist() == [[101, 102, -1], [-1, -1, -1], [-1, 111, 112]]
    assert [x.tolist() for x in listed_moves(s, d)] == [[102, 105, 112, 113], [101, 102, 111, 112]]


def test_move_rule_is_the_same_in_numpy_and_torch():
    """The rule runs in numpy on the host and in torch on a device: both branches agree (torch's
    on CPU tensors here, as on a GPU)."""
    from vllm_treespec.verify.slot_moves import _slot_pairs

    rng = np.random.default_rng(3)
    sizes = rng.integers(1, 12, size=7)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    slots = rng.permutation(200)[: offsets[-1]]
    nodes = np.full((7, 6), -1, dtype=np.int64)
    for r, n in enumerate(sizes):                  # increasing paths with i_j >= j
        path = np.sort(rng.choice(np.arange(1, n), size=min(n - 1, rng.integers(0, 6)),
                                  replace=False)) if n > 1 else []
        nodes[r, :len(path)] = path
    host = _slot_pairs(slots, offsets, nodes)
    device = _slot_pairs(*(torch.from_numpy(x) for x in (slots, offsets, nodes)))
    for h, d in zip(host, device):
        assert isinstance(d, torch.Tensor) and d.tolist() == h.tolist()
    assert (host[0] >= 0).sum() == count_moves(nodes) > 0


def test_slot_moves_by_hand():
    # request 0: path nodes 2, 5 (depths 1, 2); request 1: path 1, 2 = node prefix -> no moves
    offsets = torch.tensor([0, 6, 9])
    nodes = torch.tensor([[2, 5, -1], [1, 2, -1]])
    table = torch.tensor([[7, 3, 0], [1, 4, 2]], dtype=torch.int32)
    src, dst = accepted_slot_moves(offsets, nodes, torch.tensor([6, 4]), table, block_size=4)
    # request 0: positions 8 -> 7 and 11 -> 8 (logical block 1 = physical 3, 2 = physical 0);
    # the second move overwrites the first one's source
    assert src.tolist() == [0 * 4 + 0, 0 * 4 + 3] and dst.tolist() == [3 * 4 + 3, 0 * 4 + 0]
    assert src.dtype == dst.dtype == torch.int64
    empty = accepted_slot_moves(offsets, torch.full((2, 3), -1), torch.tensor([6, 4]), table, 4)
    assert empty[0].numel() == empty[1].numel() == 0
    with pytest.raises(ValueError, match="out of range"):
        accepted_slot_moves(offsets, torch.tensor([[6, -1], [-1, -1]]), torch.tensor([0, 0]),
                            table, 4)


class ToyModel:
    """L layers of GQA attention with neox RoPE and a residual stream (no norms, no MLP)."""

    def __init__(self, gen: torch.Generator, layers: int, vocab: int, hq: int, hkv: int, d: int):
        hid = 48
        self.hq, self.hkv, self.d = hq, hkv, d
        self.emb = torch.randn(vocab, hid, generator=gen)
        self.w = [{name: torch.randn(hid, n * d, generator=gen) / hid ** 0.5
                   for name, n in (("q", hq), ("k", hkv), ("v", hkv))}
                  | {"o": torch.randn(hq * d, hid, generator=gen) / (hq * d) ** 0.5}
                  for _ in range(layers)]

    def rope(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        half = self.d // 2
        ang = pos[:, None].double() * 10000.0 ** (-torch.arange(half).double() / half)
        cos, sin = ang.cos()[:, None].float(), ang.sin()[:, None].float()
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)

    def forward(self, caches, layout, tokens, positions, slots, batch, table, prefix):
        """One step: K/V of the rows go to `slots`, attention by the batch's tree masks."""
        h = self.emb[tokens]
        for w, cache in zip(self.w, caches):
            q = self.rope((h @ w["q"]).view(-1, self.hq, self.d), positions)
            k = self.rope((h @ w["k"]).view(-1, self.hkv, self.d), positions)
            write_slots(cache, slots, k, (h @ w["v"]).view(-1, self.hkv, self.d), layout)
            kc, vc = split_kv(cache)
            a = tree_attention(q, kc, vc, table, prefix, batch.offsets, batch.anc_mask,
                               self.d ** -0.5, layout=layout)
            h = h + a.float().flatten(1) @ w["o"]
        return h


def _prefix_tree(a: int, extra: int, rng) -> DraftTree:
    """Nodes 1..a form a chain from the root (so accepting them moves nothing), then random."""
    parents = [-1] + list(range(a)) + [int(rng.integers(a + 1 + i)) for i in range(extra)]
    tokens = list(range(len(parents)))          # distinct tokens -> distinct siblings
    return DraftTree(tokens, parents)


@pytest.mark.parametrize("layout,dtype,bs,tol,h_tol", [
    ("vec", torch.float32, 16, 1e-5, 1e-4),
    ("token_major", torch.float32, 8, 1e-5, 1e-4),
    ("amx", torch.bfloat16, 32, 2e-2, 1e-3),
])
def test_compaction_equals_chain_decode(layout, dtype, bs, tol, h_tol):
    rng = np.random.default_rng(11)
    gen = torch.Generator().manual_seed(11)
    layers, hq, hkv, d = 3, 4, 2, 32
    model = ToyModel(gen, layers, vocab=1000, hq=hq, hkv=hkv, d=d)
    trees = [random_tree(rng, 20), random_tree(rng, 40, max_children=2), _prefix_tree(3, 6, rng),
             random_tree(rng, 0), random_tree(rng, 70)]
    prefixes = [0, bs - 1, 2 * bs, 5, 3 * bs + 3]
    # accepted leaf-ward paths: random nodes; request 2 the node prefix 1..3; request 3 nothing
    ends = [int(rng.integers(1, t.num_nodes)) if t.num_nodes > 1 else 0 for t in trees]
    ends[2] = 3
    paths = [list(t.path_to(e))[1:] for t, e in zip(trees, ends)]   # without the root
    assert any(p != list(range(1, len(p) + 1)) for p in paths)
    b = len(trees)
    batch = TreeBatch.from_trees(trees)
    need = [-(-(p + t.num_nodes) // bs) for p, t in zip(prefixes, trees)]
    num_blocks = sum(need) + 2
    table = random_block_table(gen, need, num_blocks, max(need) + 1)
    prefix = torch.tensor(prefixes)

    tree_caches = [poisoned_cache(num_blocks, hkv, bs, d, dtype) for _ in range(layers)]
    for cache in tree_caches:                  # shared prefix K/V, as earlier steps left it
        for r, p in enumerate(prefixes):
            write_slots(cache, logical_slots(table[r], torch.arange(p), bs),
                        torch.randn(p, hkv, d, generator=gen),
                        torch.randn(p, hkv, d, generator=gen), layout)
    chain_caches = [c.clone() for c in tree_caches]

    # Tree step: node i of request r at slot of position p_r + i, RoPE position p_r + depth(i).
    slots = torch.cat([logical_slots(table[r], p + torch.arange(t.num_nodes), bs)
                       for r, (p, t) in enumerate(zip(prefixes, trees))])
    positions = torch.cat([p + torch.from_numpy(t.depth) for p, t in zip(prefixes, trees)])
    h_tree = model.forward(tree_caches, layout, batch.tokens, positions, slots, batch, table,
                           prefix)

    # Chain step over root + accepted path only: positions and slots p_r + j.
    chains = [DraftTree.chain(int(t.tokens[0]), [int(t.tokens[i]) for i in path])
              for t, path in zip(trees, paths)]
    cbatch = TreeBatch.from_trees(chains)
    cslots = torch.cat([logical_slots(table[r], p + torch.arange(c.num_nodes), bs)
                        for r, (p, c) in enumerate(zip(prefixes, chains))])
    cpos = torch.cat([p + torch.arange(c.num_nodes) for p, c in zip(prefixes, chains)])
    h_chain = model.forward(chain_caches, layout, cbatch.tokens, cpos, cslots, cbatch, table,
                            prefix)
    rows = torch.cat([batch.offsets[r] + torch.tensor([0] + path, dtype=torch.int64)
                      for r, path in enumerate(paths)])
    torch.testing.assert_close(h_tree[rows], h_chain, atol=h_tol, rtol=h_tol)

    before = [c.clone() for c in tree_caches]
    width = max(len(p) for p in paths) + 1
    accepted = torch.full((b, width), -1, dtype=torch.int64)
    for r, path in enumerate(paths):
        accepted[r, :len(path)] = torch.tensor(path, dtype=torch.int64)
    src, dst = accepted_slot_moves(batch.offsets, accepted, prefix, table, bs)
    moving = [[i for j, i in enumerate(path, 1) if i != j] for path in paths]
    assert src.numel() == sum(map(len, moving)) and not moving[2] and not moving[3]
    compact_kv(tree_caches, src, dst, layout=layout)

    for layer in range(layers):
        kc, vc = split_kv(tree_caches[layer])
        bk, bv = split_kv(before[layer])
        ck, cv = split_kv(chain_caches[layer])
        for r, (p, path) in enumerate(zip(prefixes, paths)):
            n = p + len(path) + 1
            got = gather_paged_kv(kc, vc, table[r], n, layout=layout)
            chain = gather_paged_kv(ck, cv, table[r], n, layout=layout)
            old = gather_paged_kv(bk, bv, table[r], p + trees[r].num_nodes, layout=layout)
            moved = torch.tensor([p] + [p + i for i in path]) if path else torch.tensor([p])
            for x, y, z in zip(got, chain, old):
                assert torch.equal(x[:p], z[:p])                      # prefix untouched
                assert torch.equal(x[p:], z[moved])                   # exact moves
                torch.testing.assert_close(x[p:].float(), y[p:].float(), atol=tol, rtol=tol)
        # nothing but the destination slots changed (NaN poison compared bitwise)
        as_bits = {torch.float32: torch.int32, torch.bfloat16: torch.int16}[dtype]
        targets = set(dst.tolist())
        for slot in range(num_blocks * bs):
            if slot not in targets:
                for x, y in zip(read_slot_reference(kc, vc, slot, layout),
                                read_slot_reference(bk, bv, slot, layout)):
                    assert torch.equal(x.view(as_bits), y.view(as_bits))


def test_batched_equals_sequential_and_stacked():
    """Gather-then-scatter == one move at a time in ascending j (what in-place kernels do),
    and a stacked [L, ...] cache moves in one op exactly like the per-layer list."""
    rng = np.random.default_rng(12)
    gen = torch.Generator().manual_seed(12)
    bs, hkv, d, layers = 16, 2, 32, 4
    trees = [random_tree(rng, n) for n in (30, 50, 9)]
    batch = TreeBatch.from_trees(trees)
    prefix = torch.tensor([3, 17, 40])
    need = [-(-(int(p) + t.num_nodes) // bs) for p, t in zip(prefix, trees)]
    table = random_block_table(gen, need, sum(need), max(need))
    paths = [list(t.path_to(int(t.leaves()[-1])))[1:] for t in trees]
    accepted = torch.full((3, max(map(len, paths))), -1, dtype=torch.int64)
    for r, path in enumerate(paths):
        accepted[r, :len(path)] = torch.tensor(path)
    src, dst = accepted_slot_moves(batch.offsets, accepted, prefix, table, bs)
    assert src.numel() > 0
    stacked = torch.randn(layers, sum(need), hkv, bs, 2 * d, generator=gen)
    per_layer = [x.clone() for x in stacked]
    sequential = [x.clone() for x in stacked]
    compact_kv(stacked, src, dst, layout="vec")
    compact_kv(per_layer, src, dst, layout="vec")
    for s, t in zip(src.tolist(), dst.tolist()):
        compact_kv(sequential, torch.tensor([s]), torch.tensor([t]), layout="vec")
    for layer in range(layers):
        assert torch.equal(stacked[layer], per_layer[layer])
        assert torch.equal(per_layer[layer], sequential[layer])
