"""One verification step's tree metadata, built once per step and shared by the runner patches
(positions, acceptance, KV compaction) and the tree attention backend.

vLLM lays out a request with drafts as its root (the token sampled last step) followed by its
draft tokens, at flat token rows ``query_start .. query_start + n``, with slots and logits
for every row. Our drafters sent the draft tokens in tree node order, so the rows are the
tree's nodes; only three things differ from a chain, and this plan carries them:
- positions: node i sits at ``num_computed + depth(i)`` (RoPE), not ``num_computed + i``;
- attention: rows whose ancestors are not exactly the rows before them need the tree mask
  (``attn``; chain-shaped requests keep the stock causal kernel, which is exact for them);
- acceptance: the accepted path's K/V move from slot(i_j) to slot(j) afterwards.

The scheduler may cut a request's drafts to a prefix (token budget, max_model_len): the tree is
cut the same way (any prefix of the node list is a tree). If the scheduled tokens are not a
prefix of the tree we drafted (which should not happen), the request is verified as the chain
it then is, which is exact for any token sequence (and, having no draft q rows, by the
target-only rule even when its drafts were sampled). Drafts we did not make (vLLM pads newly
scheduled decodes with -1 "drafts" for uniform batches) are left to vLLM's rejection sampler.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from vllm_treespec.tree import DraftTree
from vllm_treespec.tree.batch import TreeBatch

__all__ = ["AttentionPlan", "TreeStep", "plan_tree_step", "current_step",
           "set_current_step"]


@dataclass
class AttentionPlan:
    """The tree rows the stock causal kernel gets wrong, in the layout tree_attention takes.

    Node i's causal row is exact when its ancestors are exactly nodes 0..i, i.e. depth(i) == i
    (the tree's first chain); every other row is recomputed with the ancestor mask."""
    req_indices: torch.Tensor   # int64 [Ra]  batch rows (index into block_table)
    rows: torch.Tensor          # int64 [Ta]  flat token rows to recompute, request by request
    offsets: torch.Tensor       # int64 [Ra+1]
    prefix_lens: torch.Tensor   # int64 [Ra]  num_computed (KV before the root)
    tree_sizes: torch.Tensor    # int64 [Ra]  nodes of each tree (KV after the prefix)
    anc_mask: torch.Tensor      # int64 [Ta, W] local ancestor-or-self bitmask words
    # every node of those trees, root first (the Triton kernel recomputes whole trees: its
    # query row i must be node i; engine/tree_attention_triton.py)
    tree_rows: torch.Tensor     # int64 [Tn]  flat token rows, request by request
    tree_anc_mask: torch.Tensor  # int64 [Tn, W] their ancestor-or-self bitmask words
    # per-step kernel state shared by all layers (the CPU path's mask plan, the Triton path's
    # device tensors), keyed by the layer geometry or device; filled by the attention backend
    # on the step's first tree layer
    kernel_plans: dict = field(default_factory=dict)
    seconds: float = 0.0        # tree attention time of the step so far (all layers)


@dataclass
class TreeStep:
    """Everything the step's patches need about the requests verified as trees.

    Requests "verified" are those with at least one scheduled draft (``R`` of them, batch order).
    vLLM computes logits at every root/draft row and one row for each request without drafts,
    in batch order; ``first_logit`` is where each request's rows start.

    Only what every step reads is built eagerly; the per-node rows and positions (needed only
    by steps with branching trees) and the per-request logits layout (needed only when vLLM's
    sampler shares the step) are derived on first use: at one request per step each numpy call
    costs microseconds with the caches cold from the forward pass, and most steps need few.
    """
    num_scheduled_tokens: int
    num_reqs: int
    req_indices: np.ndarray      # int64 [R] batch rows
    req_ids: list[str]
    trees: TreeBatch             # the R trees (cut to what was scheduled): the step's one tree
                                 # batch, read unchanged by attention, acceptance, compaction
    num_draft: np.ndarray        # int64 [num_reqs] scheduled drafts per batch request (0 = none)
    query_start_loc: np.ndarray  # int64 [num_reqs + 1] flat row of each request's first token
    num_computed: np.ndarray     # int64 [R] tokens before each tree's root (its KV prefix)
    attn: AttentionPlan | None
    foreign: np.ndarray          # int64 batch rows whose drafts are left to vLLM's rejection sampler
    max_num_draft: int           # widest scheduled draft in the batch (sampler output width - 1)
    slot_mapping: torch.Tensor | None = None  # int64 [T] KV slot of every node row (set by the
                                              # runner unless chain_shaped: only then can
                                              # compaction move K/V)
    q_rows: np.ndarray | None = None    # int64 [T] row of q_probs per tree node (-1 = none)
    q_probs: torch.Tensor | None = None  # float32 [M, V] draft q of sampled trees' expanded nodes
    plan_seconds: float = 0.0           # planning it in `_prepare_inputs` (runner patch), for budget.gain

    @property
    def tree_sizes(self) -> np.ndarray:
        """int64 [R]: nodes of each tree (root included)."""
        return self.trees.sizes.numpy()

    @property
    def node_local(self) -> np.ndarray:
        """int64 [T]: index of every node within its tree."""
        return self.trees.local.numpy()

    @cached_property
    def node_rows(self) -> torch.Tensor:
        """int64 [T]: flat token row of every node."""
        q_start = self.query_start_loc[self.req_indices]
        return torch.from_numpy(np.repeat(q_start, self.tree_sizes) + self.node_local)

    @cached_property
    def positions(self) -> torch.Tensor:
        """int64 [T]: num_computed + depth of every node (its RoPE position)."""
        return torch.from_numpy(np.repeat(self.num_computed, self.tree_sizes) + self.trees.depth.numpy())

    @cached_property
    def first_logit(self) -> np.ndarray:
        """int64 [num_reqs]: first logits row of each batch request."""
        sampled = self.num_draft + 1                # logits rows per batch request
        return np.cumsum(sampled) - sampled

    @cached_property
    def tree_of_req(self) -> np.ndarray:
        """int64 [num_reqs]: index into the trees of each batch request, -1 = no tree."""
        out = np.full(self.num_reqs, -1, dtype=np.int64)
        out[self.req_indices] = np.arange(self.req_indices.size)
        return out

    @property
    def logit_rows(self) -> np.ndarray:
        """int64 [T]: row of each tree node in the step's logits."""
        return np.repeat(self.first_logit[self.req_indices], self.tree_sizes) + self.node_local

    @property
    def chain_shaped(self) -> bool:
        """Every node lies on its tree's first chain (depth == index; `attn` lists none off it).
        Then the nodes' positions num_computed + depth equal vLLM's num_computed + index, and no
        accepted path can leave that chain, so compaction moves nothing: such steps need
        neither the position rewrite nor the slot mapping."""
        return self.attn is None

    @property
    def has_foreign_drafts(self) -> bool:
        return self.foreign.size > 0

    @property
    def num_trees(self) -> int:
        return len(self.req_ids)


def plan_tree_step(batch_req_ids: Sequence[str], num_scheduled: np.ndarray,
                   scheduled_drafts: Mapping[str, Sequence[int]], trees: Mapping[str, DraftTree],
                   query_start_loc: np.ndarray, num_computed: np.ndarray,
                   draft_probs: Mapping[str, Any] | None = None) -> TreeStep:
    """The plan for this step (with no trees when no request has drafts: sampling still runs
    through tree acceptance, so a seeded request's random stream never depends on its batch).

    batch_req_ids / num_scheduled / query_start_loc [num_reqs + 1] / num_computed: the runner's
    batch in row order; scheduled_drafts: the scheduler's draft tokens per request id;
    trees: the trees the proposer drafted last step, by request id; draft_probs: the q rows
    (drafters/draft_sampling.DraftProbs) of those whose children were drawn from q.
    """
    num_reqs = len(batch_req_ids)
    req_idx: list[int] = []
    cut: list[DraftTree] = []
    num_draft = [0] * num_reqs
    foreign: list[int] = []
    # (tree, q row of each of its nodes) of the trees drawn from a drafter's q; other nodes -1
    q_index: list[tuple[int, np.ndarray]] = []
    q_parts: list[Any] = []
    q_count = 0
    for i, req_id in enumerate(batch_req_ids):
        drafts = scheduled_drafts.get(req_id)
        if not drafts:
            continue
        n = len(drafts)
        num_draft[i] = n
        if int(num_scheduled[i]) != n + 1 or min(drafts) < 0:
            # drafts behind other new tokens (not a plain decode step), or vLLM's -1 padding of
            # a newly scheduled decode (always rejected): vLLM verifies this chain itself
            foreign.append(i)
            continue
        tree = trees.get(req_id)
        if tree is None or tree.num_draft < n or tree.tokens[1:n + 1].tolist() != list(drafts):
            # not the tree we drafted: verify as a chain (exact for any tokens)
            root = tree.tokens[0] if tree is not None else 0
            tree = DraftTree.chain(int(root), drafts)
        else:
            tree = tree.prefix(n)
            dp = draft_probs.get(req_id) if draft_probs else None
            if dp is not None:
                local = dp.node_rows[:n + 1]
                q_index.append((len(cut), np.where(local >= 0, local + q_count, -1)))
                q_parts.append(dp.probs)
                q_count += int(dp.probs.shape[0])
        req_idx.append(i)
        cut.append(tree)
    idx = np.asarray(req_idx, dtype=np.int64)
    batch = TreeBatch.from_trees(cut)
    offsets = batch.offsets.numpy()
    step = TreeStep(
        num_scheduled_tokens=int(query_start_loc[num_reqs]), num_reqs=num_reqs,
        req_indices=idx, req_ids=[batch_req_ids[i] for i in req_idx], trees=batch,
        num_draft=np.array(num_draft, dtype=np.int64),
        query_start_loc=np.array(query_start_loc[:num_reqs + 1], dtype=np.int64),
        num_computed=np.asarray(num_computed, dtype=np.int64)[idx], attn=None,
        foreign=np.asarray(foreign, dtype=np.int64), max_num_draft=max(num_draft, default=0),
        q_rows=_q_rows(q_index, offsets),
        q_probs=torch.cat(q_parts) if q_parts else None)
    step.attn = _attention_plan(step)
    return step


def _q_rows(sampled: list[tuple[int, np.ndarray]], offsets: np.ndarray) -> np.ndarray | None:
    """int64 [T]: q row of every node (-1: target-only rule); None when no tree was sampled."""
    if not sampled:
        return None
    rows = np.full(int(offsets[-1]), -1, dtype=np.int64)
    for tree, local in sampled:
        rows[offsets[tree]:offsets[tree] + local.size] = local
    return rows


def _attention_plan(step: TreeStep) -> AttentionPlan | None:
    batch = step.trees
    depth = batch.depth.numpy()
    wrong = depth != step.node_local                        # rows the causal kernel gets wrong
    if not wrong.any():
        return None
    sizes = step.tree_sizes
    owner = np.repeat(np.arange(sizes.size), sizes)
    branchy = np.unique(owner[wrong])
    # masks of the wrong rows come with the rest of their trees' (the step batch's words)
    nodes = np.isin(owner, branchy)
    anc = batch.anc_mask.numpy()[nodes]
    row_offsets = np.zeros(branchy.size + 1, dtype=np.int64)
    np.cumsum(np.bincount(owner[wrong], minlength=sizes.size)[branchy], out=row_offsets[1:])
    return AttentionPlan(
        req_indices=torch.from_numpy(step.req_indices[branchy]),
        rows=step.node_rows[torch.from_numpy(wrong)],
        offsets=torch.from_numpy(row_offsets), prefix_lens=torch.from_numpy(step.num_computed[branchy]),
        tree_sizes=torch.from_numpy(sizes[branchy]), anc_mask=torch.from_numpy(anc[wrong[nodes]]),
        tree_rows=step.node_rows[torch.from_numpy(nodes)], tree_anc_mask=torch.from_numpy(anc))


# The plan of the step being executed in this worker process (None outside verification), for
# the attention backends only. A process global because vLLM constructs the backends' metadata
# builders and calls their forward with metadata it builds itself: nothing on vLLM's metadata
# path can carry the plan to them. Everything else (the runner patches, sampling) reads it from
# the proposer (`TreeProposer.plan`, set beside this one in runner_patches._publish_plan).
_CURRENT: TreeStep | None = None


def set_current_step(step: TreeStep | None) -> None:
    global _CURRENT
    _CURRENT = step


def current_step() -> TreeStep | None:
    return _CURRENT


def step_to_mask(is_decoder: bool, attn_metadata: Any) -> TreeStep | None:
    """The step whose tree rows an attention call must mask, or None (no tree step, vLLM's
    profiling run, non-decoder attention). Raises when the plan and the batch disagree, rather
    than masking the wrong rows. Both tree backends (CPU, Triton) start their forward here."""
    step = _CURRENT
    if step is None or step.attn is None or attn_metadata is None or not is_decoder:
        return None
    if attn_metadata.num_actual_tokens != step.num_scheduled_tokens:
        raise RuntimeError(
            f"tree attention: the step plan covers {step.num_scheduled_tokens} tokens but "
            f"the attention batch has {attn_metadata.num_actual_tokens}; refusing to mask "
            "the wrong rows")
    return step
