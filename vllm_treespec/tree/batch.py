"""TreeBatch: one step's draft trees as flat index tensors, the one tree contract of a step.

The engine builds it once per step in the step plan (engine/tree_step.py) from the requests'
`DraftTree`s; tree attention takes its ancestor words, acceptance (verify/) its tokens, parents
and children table, KV compaction its offsets, unchanged, on the host or as the device twin
`to(device)` makes. Requests are laid out one after another (SGLang-style flat rows), each
with its root first, in the order of the trees given (= the order of the requests in the step):

==============  ================  =======================================================
field           dtype / shape     meaning
==============  ================  =======================================================
offsets         int64 [B+1]       request b owns flat rows offsets[b] .. offsets[b+1]-1;
                                  offsets[0] = 0, offsets[B] = T; row offsets[b] is its root
tokens          int64 [T]         token id of each node (root = last sampled token)
parents         int64 [T]         parent as a LOCAL index within the request (0 = its root),
                                  -1 at each root; parents[r] < r - offsets[b] for drafts
depth           int64 [T]         0 at the root; position = num_computed_tokens + depth
derived on first use (cached; none is built unless a consumer reads it):
request_of_row  int64 [T]         the request b of each row
local           int64 [T]         each row's index within its request (flat = offsets[b] + local)
anc_mask        int64 [T, W]      LOCAL ancestor-or-self bitmask: bit j (word j // 64, bit
                                  j % 64, two's-complement view of uint64) of row r is set
                                  iff local node j of the same request is r's ancestor or r
                                  itself; W = max over the batch of ceil((N_b+1)/64), words
                                  past a request's own ceil((N_b+1)/64) are 0
children        int64 [T, C]      flat rows of each node's children in index order, -1 padded
                                  (C >= 1)
num_children    int64 [T]
max_depth       int               largest depth in the batch
==============  ================  =======================================================

Local indices keep every request's masks and parents independent of where it lands in the
flat batch, so a request's rows can be cut to a prefix (vLLM may schedule fewer drafts) without
touching the others. Sibling tokens are distinct (`check` enforces it with the rest of the
contract: a duplicate sibling would double-count a token's acceptance chance).

Example:
    >>> from vllm_treespec.tree import DraftTree, TreeBatch
    >>> b = TreeBatch.from_trees([DraftTree([5, 7, 8], [-1, 0, 0]), DraftTree.root_only(3)])
    >>> b.offsets.tolist(), b.parents.tolist(), b.anc_mask[:, 0].tolist()
    ([0, 3, 4], [-1, 0, 0, -1], [1, 3, 5, 1])
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any, Sequence

import numpy as np
import torch

from vllm_treespec.tree.ancestors import ancestor_words, local_index
from vllm_treespec.tree.draft_tree import DraftTree

__all__ = ["TreeBatch"]


def _int64(value: Any, name: str) -> torch.Tensor:
    t = torch.as_tensor(value)
    if t.dtype.is_floating_point or t.dtype == torch.bool or t.is_complex():
        raise TypeError(f"tree {name} must hold integers, got dtype {t.dtype}")
    if t.dim() != 1:
        raise ValueError(f"tree {name} must be 1-D, got shape {tuple(t.shape)}")
    return t.to(torch.int64)


def _first(mask: torch.Tensor) -> int:
    return int(mask.nonzero()[0, 0])


@dataclass(eq=False)
class TreeBatch:
    """Flat tensors for one step's trees; see the module docstring for the exact format."""
    offsets: torch.Tensor   # int64 [B+1]
    tokens: torch.Tensor    # int64 [T]
    parents: torch.Tensor   # int64 [T] local, -1 at roots
    depth: torch.Tensor     # int64 [T]

    # -- construction ------------------------------------------------------------------------
    @classmethod
    def from_trees(cls, trees: Sequence[DraftTree]) -> "TreeBatch":
        """Concatenate trees (one per request, in request order) into the flat layout."""
        if len(trees) == 0:
            z = torch.zeros(0, dtype=torch.int64)
            return cls(torch.zeros(1, dtype=torch.int64), z, z.clone(), z.clone())
        sizes = np.fromiter((t.num_nodes for t in trees), dtype=np.int64, count=len(trees))
        offsets = np.zeros(len(trees) + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        f = lambda a: torch.from_numpy(np.ascontiguousarray(a, dtype=np.int64))  # noqa: E731
        if len(trees) == 1:     # the common one-request step: no concatenation copies
            t = trees[0]
            return cls(f(offsets), f(t.tokens), f(t.parents), f(t.depth))
        cat = lambda name: f(np.concatenate([getattr(t, name) for t in trees]))  # noqa: E731
        return cls(f(offsets), cat("tokens"), cat("parents"), cat("depth"))

    @classmethod
    def from_arrays(cls, offsets: Any, tokens: Any, parents: Any, depth: Any = None) -> "TreeBatch":
        """A batch from flat integer arrays (the C++ drafters', a test's); `depth` is derived
        from the parents when not given (`check` then only has the parents to validate)."""
        offsets, tokens, parents = (_int64(v, n) for v, n in
                                    ((offsets, "offsets"), (tokens, "tokens"), (parents, "parents")))
        if depth is None:
            depth = _depth_from_parents(offsets, parents)
        return cls(offsets, tokens, parents, _int64(depth, "depth"))

    @classmethod
    def root_only(cls, tokens: Any) -> "TreeBatch":
        """B one-node trees (requests without drafts) with these root tokens."""
        tokens = _int64(tokens, "tokens")
        n = tokens.numel()
        return cls(torch.arange(n + 1, device=tokens.device), tokens,
                   torch.full_like(tokens, -1), torch.zeros_like(tokens))

    def gather(self, tree_of: np.ndarray) -> tuple["TreeBatch", np.ndarray]:
        """(batch, source rows int64 [T']): a batch whose entry i is this batch's tree
        ``tree_of[i]``, or a root-only tree (token 0: a walk never reads a root's token) where
        ``tree_of[i]`` is -1, and the row of this batch each of its rows came from (-1: a
        root-only tree's). For an engine step that verifies requests without drafts, or a subset
        of its requests, beside its trees."""
        tree_of = np.asarray(tree_of, dtype=np.int64)
        src_offsets = self.offsets.cpu().numpy()
        has_tree = tree_of >= 0
        sizes = np.ones(tree_of.size, dtype=np.int64)
        sizes[has_tree] = np.diff(src_offsets)[tree_of[has_tree]]
        offsets = np.zeros(tree_of.size + 1, dtype=np.int64)
        np.cumsum(sizes, out=offsets[1:])
        src = np.full(int(offsets[-1]), -1, dtype=np.int64)
        if has_tree.any():
            k = np.nonzero(has_tree)[0]
            n = sizes[k]
            local = local_index(n)
            src[np.repeat(offsets[k], n) + local] = np.repeat(src_offsets[:-1][tree_of[k]], n) + local
        has = src >= 0
        fields = []
        for field, fill in ((self.tokens, 0), (self.parents, -1), (self.depth, 0)):
            out = np.full(src.size, fill, dtype=np.int64)
            out[has] = field.cpu().numpy()[src[has]]
            fields.append(torch.from_numpy(out))
        return TreeBatch(torch.from_numpy(offsets), *fields), src

    # -- shape -------------------------------------------------------------------------------
    @property
    def batch_size(self) -> int:
        return int(self.offsets.shape[0]) - 1

    @property
    def num_rows(self) -> int:
        """T, total nodes (roots included)."""
        return int(self.tokens.shape[0])

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    @cached_property
    def sizes(self) -> torch.Tensor:
        """int64 [B]: nodes of each tree (root included)."""
        return self.offsets[1:] - self.offsets[:-1]

    @cached_property
    def max_depth(self) -> int:
        return int(self.depth.max()) if self.num_rows else 0

    @property
    def is_root_only(self) -> bool:
        """A valid batch of root-only trees (a step in which no request drafted): at least one
        request, each owning one row, its root. A batch that only looks so is left to `check`."""
        n = self.batch_size
        return (n >= 1 and self.num_rows == n
                and bool((self.offsets == torch.arange(n + 1, device=self.device)).all())
                and bool((self.parents == -1).all()) and bool((self.depth == 0).all()))

    def request_rows(self, b: int) -> slice:
        """Flat rows of request b."""
        return slice(int(self.offsets[b]), int(self.offsets[b + 1]))

    # -- derived tables (first use only) -------------------------------------------------------
    @cached_property
    def request_of_row(self) -> torch.Tensor:
        """int64 [T]: the request of every row."""
        if self.device.type == "cpu":
            return torch.from_numpy(np.repeat(np.arange(self.batch_size), self.sizes.numpy()))
        return torch.repeat_interleave(torch.arange(self.batch_size, device=self.device), self.sizes)

    @cached_property
    def local(self) -> torch.Tensor:
        """int64 [T]: every row's index within its request."""
        if self.device.type == "cpu":
            return torch.from_numpy(local_index(self.sizes.numpy()))
        return torch.arange(self.num_rows, device=self.device) - self.offsets[:-1][self.request_of_row]

    @cached_property
    def global_parents(self) -> torch.Tensor:
        """int64 [T]: parent as a flat row index (-1 at roots)."""
        base = self.offsets[:-1][self.request_of_row]
        return torch.where(self.parents >= 0, self.parents + base, self.parents)

    @cached_property
    def anc_mask(self) -> torch.Tensor:
        """int64 [T, W] local ancestor-or-self words (module docstring), from
        tree/ancestors.py, the one mask implementation; built on the host."""
        host = lambda t: t.cpu().numpy()  # noqa: E731
        words = ancestor_words(host(self.offsets), host(self.parents), host(self.depth))
        if words.shape[1] == 0:           # an empty batch still has one (empty) word column
            words = np.zeros((0, 1), dtype=np.uint64)
        return torch.from_numpy(words.view(np.int64)).to(self.device)

    @cached_property
    def _children_table(self) -> tuple[torch.Tensor, torch.Tensor]:
        draft = self.parents >= 0
        child_rows = draft.nonzero().squeeze(1)
        child_parent = self.global_parents[child_rows]
        # a stable sort by parent keeps siblings in index order
        order = torch.sort(child_parent, stable=True).indices
        child_rows, child_parent = child_rows[order], child_parent[order]
        num_children = torch.bincount(child_parent, minlength=self.num_rows)
        width = int(num_children.max()) if child_rows.numel() else 0
        children = torch.full((self.num_rows, max(width, 1)), -1, dtype=torch.int64, device=self.device)
        if child_rows.numel():
            rank = torch.arange(child_rows.numel(), device=self.device) - torch.searchsorted(
                child_parent, child_parent)
            children[child_parent, rank] = child_rows
        return children, num_children

    @property
    def children(self) -> torch.Tensor:
        """int64 [T, C]: flat rows of each node's children, index order, -1 padded."""
        return self._children_table[0]

    @property
    def num_children(self) -> torch.Tensor:
        """int64 [T]."""
        return self._children_table[1]

    # -- contract ------------------------------------------------------------------------------
    def check(self, vocab_size: int | None = None) -> "TreeBatch":
        """Raise ValueError naming the request and node that break the contract (module
        docstring); `vocab_size`: also require draft tokens in [0, vocab_size). Returns self."""
        offsets, tokens, parents, depth = self.offsets, self.tokens, self.parents, self.depth
        if offsets.numel() < 2:
            raise ValueError("tree offsets must have B+1 >= 2 entries (at least one request)")
        num_rows = tokens.numel()
        for name, t in (("parents", parents), ("depth", depth)):
            if t.numel() != num_rows:
                raise ValueError(f"tree {name} has {t.numel()} entries but tokens has {num_rows}")
        if int(offsets[0]) != 0 or int(offsets[-1]) != num_rows:
            raise ValueError(f"tree offsets must start at 0 and end at the number of rows ({num_rows}); "
                             f"got {int(offsets[0])}..{int(offsets[-1])}")
        sizes = self.sizes
        if bool((sizes < 1).any()):
            b = _first(sizes < 1)
            raise ValueError(f"request {b} owns {int(sizes[b])} rows; every request needs at least its "
                             "root row (offsets must be strictly increasing)")
        local = self.local
        is_root = local == 0
        bad = (is_root & (parents != -1)) | (~is_root & ((parents < 0) | (parents >= local)))
        if bool(bad.any()):
            row = _first(bad)
            raise ValueError(f"invalid parent {int(parents[row])} at request {int(self.request_of_row[row])}, "
                             f"node {int(local[row])}: the root (node 0) must have parent -1 and node "
                             "i>0 a parent in [0, i) (local indices)")
        if vocab_size is not None:
            bad_tok = ~is_root & ((tokens < 0) | (tokens >= vocab_size))
            if bool(bad_tok.any()):
                row = _first(bad_tok)
                raise ValueError(f"token {int(tokens[row])} at request {int(self.request_of_row[row])}, "
                                 f"node {int(local[row])} is outside the vocabulary [0, {vocab_size})")
        if bool((depth != _depth_from_parents(offsets, parents)).any()):
            raise ValueError("tree depth disagrees with parents (depth[root] must be 0 and "
                             "depth[i] = depth[parent[i]] + 1)")
        draft = ~is_root
        pairs = torch.stack([self.global_parents[draft], tokens[draft]], dim=1)
        if pairs.shape[0] > 1:
            uniq, counts = torch.unique(pairs, dim=0, return_counts=True)
            if bool((counts > 1).any()):
                prow, tok = (int(x) for x in uniq[_first(counts > 1)])
                raise ValueError(f"request {int(self.request_of_row[prow])}, node {int(local[prow])} has "
                                 f"two children with token {tok}; sibling tokens must be distinct "
                                 "(merge duplicate drafts)")
        return self

    # -- moving and reading back ---------------------------------------------------------------
    def to(self, device: torch.device | str) -> "TreeBatch":
        """The device twin: the same batch on `device`, made once (later calls return it) in one
        copy of the four fields; derived tables already built travel with it."""
        device = torch.device(device)
        if device == self.device:
            return self
        twins = self.__dict__.setdefault("_twins", {})
        twin = twins.get(device)
        if twin is None:
            b, t = self.batch_size, self.num_rows
            flat = torch.cat([self.offsets, self.tokens, self.parents, self.depth]).to(device, non_blocking=True)
            twin = twins[device] = TreeBatch(*torch.split(flat, [b + 1, t, t, t]))
            for name in ("anc_mask", "request_of_row"):
                if name in self.__dict__:
                    twin.__dict__[name] = self.__dict__[name].to(device, non_blocking=True)
        return twin

    def tree(self, b: int) -> DraftTree:
        """Request b's tree back as a DraftTree (copies; for tests and debugging)."""
        s = self.request_rows(b)
        host = lambda t: t[s].cpu().numpy().copy()  # noqa: E731
        return DraftTree(host(self.tokens), host(self.parents), host(self.depth))

    def to_trees(self) -> list[DraftTree]:
        return [self.tree(b) for b in range(self.batch_size)]


def _depth_from_parents(offsets: torch.Tensor, parents: torch.Tensor) -> torch.Tensor:
    """int64 [T]: each node's depth, by pointer jumping over local parents (one vectorised step
    per tree level); an out-of-range parent stops its chain (`check` reports it)."""
    num_rows = parents.numel()
    device = parents.device
    sizes = offsets[1:] - offsets[:-1]
    if num_rows == 0 or bool((sizes < 0).any()) or int(sizes.sum()) != num_rows:
        return torch.zeros(num_rows, dtype=torch.int64, device=device)
    base = torch.repeat_interleave(offsets[:-1], sizes)
    local = torch.arange(num_rows, device=device) - base
    valid = (parents >= 0) & (parents < local)
    up = torch.where(valid, parents + base, torch.full_like(parents, -1))
    depth = torch.zeros(num_rows, dtype=torch.int64, device=device)
    anc = up.clone()
    while bool((anc >= 0).any()):
        step = anc >= 0
        depth += step.to(torch.int64)
        anc = torch.where(step, up[anc.clamp(min=0)], anc)
    return depth
