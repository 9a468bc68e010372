"""DraftModelDrafter: an external draft LM (transformer or Mamba, drafters/lm/) drafts each
request's tree autoregressively, one batched drafter call per tree level over the frontier of
every request in the step.

Per step: the runtime catches each request's cache up to its committed tokens (one call, whose
last rows give the root's children), then the configured builder (chain, threshold = DynaTree,
static templates, best_first) runs for all requests in lockstep (tree/lockstep.py): whenever
every builder waits for children, one `extend` call computes them all. Only nodes a builder
expands are run through the drafter; leaves cost nothing until verified.

Templates: with `drafter.templates` (static builder), a UCB bandit per request picks the
template each step (tree/bandit.py) and learns from the tokens the previous step committed. Its
lambda_gamma (drafter cost per level over the target's step cost) is measured online: the
drafter's own seconds per level over the wall time between two drafting calls minus drafting.

Sampling: with `drafter.draft_sampling: top_k` drafts are the drafter's top-k children
(deterministic) and sampled requests are verified with the target-only rule, exact for any fixed
candidate set. With `sample` (and `auto`, the default, for the chain / static / threshold
builders), the trees of requests with temperature > 0 are DRAWN from
the drafter's q processed like the request's own sampling (drafters/draft_sampling.py), shaped
by the draw-order builders of tree/sampled.py, and verified by recursive rejection sampling with
the q rows handed over in the step's `Proposal.draft_probs`; greedy requests keep top-k trees.
"""
from __future__ import annotations

import time
from typing import Any, Sequence

import numpy as np
import torch

from vllm_treespec.drafters.base import DraftInputs, Drafter, DrafterCapabilities, Proposal, chain_trees
from vllm_treespec.drafters.draft_sampling import DraftProbs, DraftSampler, samples
from vllm_treespec.drafters.lm.base import DraftLM
from vllm_treespec.drafters.lm.loading import DraftModelSpec, load_draft_lm
from vllm_treespec.tree.bandit import TemplateBandit
from vllm_treespec.tree.lockstep import builder_steps, run_lockstep
from vllm_treespec.tree.sampled import sampled_steps

__all__ = ["DraftModelDrafter"]

# best_first trees: nodes expanded per drafter call when tree.prefetch is null
# (tree/builders/best_first.py). One batched call costs about as much for a few rows as for one,
# and best_first otherwise expands node by node; the tree is the same. Prefetching can double a
# request's expanded nodes, so the drafter then holds 2 x max_nodes tree nodes per request
# (lm/NOTES.md has the measurement).
BEST_FIRST_PREFETCH = 4


class _Timing:
    """Online lambda_gamma for the bandit reward: drafter seconds per level / target seconds per step."""

    def __init__(self) -> None:
        self.level_s = 0.0
        self.levels = 0
        self.target_s = 0.0
        self.steps = 0
        self.last_end: float | None = None

    def observe(self, started: float, ended: float, levels: int) -> None:
        if self.last_end is not None:
            self.target_s += max(started - self.last_end, 0.0)
            self.steps += 1
        self.last_end = ended
        self.level_s += ended - started
        self.levels += max(levels, 1)

    def lambda_gamma(self, default: float = 0.05) -> float:
        if self.steps < 4 or self.target_s <= 0:
            return default
        return (self.level_s / self.levels) / (self.target_s / self.steps)


class DraftModelDrafter(Drafter):
    name = "draft_model"

    def __init__(self, cfg: Any, tokenizer_dir: str | None, tree_config: Any, *, max_model_len: int,
                 max_nodes: int, vocab_limit: int | None = None) -> None:
        self.cfg = cfg
        self.builder = tree_config.builder if tree_config is not None else "chain"
        self.params = tree_config.builder_params() if tree_config is not None else {}
        tree_nodes = max_nodes
        if self.builder == "best_first":
            self.params.setdefault("topk", cfg.topk)
            self.params.setdefault("prefetch", BEST_FIRST_PREFETCH)
            if self.params["prefetch"] > 1:
                tree_nodes = 2 * max_nodes
        self.templates = tuple(tuple(t) for t in cfg.templates) if cfg.templates else None
        self.bandits: dict[str, TemplateBandit] = {}
        self.last_draft: dict[str, tuple[int, int, int]] = {}  # req -> (arm, committed then, depth drafted)
        self.timing = _Timing()
        self.no_slot = 0          # request-steps that drafted nothing for want of a cache slot
        self.sampled_trees = 0    # trees whose children were drawn from q (verified by rrs)
        self.lm: DraftLM = load_draft_lm(
            DraftModelSpec(cfg.path, cfg.dtype, cfg.memory_mb, cfg.max_cached_requests),
            served_tokenizer=tokenizer_dir, max_len=max_model_len, max_tree_nodes=tree_nodes + 1)
        self.vocab_limit = vocab_limit
        samples_drafts = cfg.samples_with(self.builder)     # the proposer passes SamplingParams
        self.capabilities = DrafterCapabilities(samples_drafts=samples_drafts)
        self.sampler = DraftSampler(vocab_limit) if samples_drafts else None

    def load(self, target_model: Any) -> None:
        """The draft model is separate from the target; it was loaded (and checked) at construction."""

    def on_requests_finished(self, req_ids: Sequence[str]) -> None:
        self.lm.release(req_ids)
        if self.sampler is not None:
            self.sampler.release(req_ids)
        for r in req_ids:
            self.bandits.pop(r, None)
            self.last_draft.pop(r, None)

    def tracked_requests(self) -> dict[str, int]:
        counts = {"bandits": len(self.bandits), "last_draft": len(self.last_draft),
                  "cache_slots": self.lm.tracked_requests()}
        if self.sampler is not None:
            counts["sampler_generators"] = len(self.sampler.generators)
        return counts

    def counters(self) -> dict[str, int]:
        """Drafter-side counts for tests and reports."""
        return {"no_slot": self.no_slot, "evictions": self.lm.evictions, "sampled_trees": self.sampled_trees}

    # -- drafting ------------------------------------------------------------------------
    def propose(self, inputs: DraftInputs) -> Proposal:
        started = time.perf_counter()
        n = len(inputs)
        out = Proposal(chain_trees(inputs, [()] * n))          # root-only: no drafts
        trees = out.trees
        want = np.nonzero(np.asarray(inputs.budgets) > 0)[0]
        if want.size == 0:
            return out
        ids = [inputs.req_ids[i] for i in want.tolist()]
        ok = self.lm.admit(ids)
        self.no_slot += int((~ok).sum())
        want, ids = want[ok], [r for r, o in zip(ids, ok.tolist()) if o]
        if want.size == 0:
            return out
        contexts = [np.asarray(inputs.context(i, int(inputs.num_tokens[i])), dtype=np.int64)
                    for i in want.tolist()]
        root_lp = self.lm.start_step(ids, contexts)
        gens, arms, drawn = [], [], {}
        step_params = inputs.tree_params(self.params)           # with a budget.table rule's tree keys
        for j, i in enumerate(want.tolist()):
            params = dict(step_params)
            if self.templates is not None:
                arms.append(self._choose_arm(ids[j], contexts[j].shape[0]))
                params["template"] = self.templates[arms[-1]]
            root, budget = int(contexts[j][-1]), int(inputs.budgets[i])
            sp = inputs.sampling[i] if self.sampler is not None and inputs.sampling else None
            if samples(sp):
                drawn[j] = (sp, self.sampler.generator(ids[j], sp))
                gens.append(sampled_steps(self.builder, root, budget, **params))
            else:
                gens.append(builder_steps(self.builder, root, budget, **params))
        expander = _LevelExpander(self.lm, root_lp, self.vocab_limit, self.sampler, drawn)
        built = run_lockstep(gens, expander, ordered=True)
        for j, i in enumerate(want.tolist()):
            trees[i] = built[j]
            if j in drawn:
                out.draft_probs[i] = expander.draft_probs(j, built[j].num_nodes)
                self.sampled_trees += int(built[j].num_draft > 0)
            if arms:                               # the bandit learns from the depth actually drafted
                self.last_draft[ids[j]] = (arms[j], contexts[j].shape[0], int(built[j].depth.max()))
        self.timing.observe(started, time.perf_counter(), expander.calls + 1)
        return out

    def _choose_arm(self, req_id: str, committed: int) -> int:
        bandit = self.bandits.get(req_id)
        if bandit is None:
            bandit = self.bandits[req_id] = TemplateBandit(self.templates, lambda_ucb=self.cfg.bandit_ucb,
                                                           seed=0)
        last = self.last_draft.pop(req_id, None)
        if last is not None and committed > last[1] and last[2] > 0:
            bandit.lambda_gamma = self.timing.lambda_gamma(bandit.lambda_gamma)
            bandit.update(last[0], accepted_len=committed - last[1], draft_len=last[2])
        return bandit.choose()


class _LevelExpander:
    """`run_lockstep`'s batched expansion: one `extend` call over every node all builders wait
    on. A node is run through the drafter when it is expanded (its runtime id is the next of its
    request, in call order); the root's children come from the catch-up call.

    Requests in ``drawn`` (index -> (SamplingParams, generator)) get draws from their processed
    q in draw order instead of the top-k, and the q row of every node they expand is kept."""

    def __init__(self, lm: DraftLM, root_logprobs: torch.Tensor, vocab_limit: int | None,
                 sampler: DraftSampler | None = None, drawn: dict[int, tuple[Any, Any]] | None = None
                 ) -> None:
        self.lm = lm
        self.root_lp = root_logprobs
        self.vocab_limit = vocab_limit     # the target's vocabulary: never draft ids past it
        self.sampler = sampler
        self.drawn = drawn or {}
        self.q_rows: dict[int, tuple[list[int], list[torch.Tensor]]] = {}  # request -> (node ids, q)
        self.runtime_id: dict[tuple[int, int], int] = {}    # (request, builder node id) -> runtime id
        self.next_id: dict[int, int] = {}
        self.calls = 0

    def __call__(self, requests: Sequence[Any]) -> list[tuple[np.ndarray, np.ndarray]]:
        rows: list[tuple[bool, int]] = []     # per expanded node: (is root, row in root_lp / extend output)
        req_index, parent, tokens = [], [], []
        for req in requests:
            b = req.index
            for path, node, par in zip(req.paths, req.node_ids, req.parent_ids):
                if par < 0:
                    rows.append((True, b))
                    continue
                rt = self.next_id.get(b, 1)
                self.next_id[b] = rt + 1
                self.runtime_id[(b, node)] = rt
                req_index.append(b)
                parent.append(0 if par == 0 else self.runtime_id[(b, par)])
                tokens.append(int(path[-1]))
                rows.append((False, len(req_index) - 1))
        lp = None
        if req_index:
            self.calls += 1
            lp = self.lm.extend(np.asarray(req_index), np.asarray(parent), np.asarray(tokens))
        out, r = [], 0
        for req in requests:
            sel = rows[r:r + len(req.paths)]
            r += len(req.paths)
            dist = torch.stack([self.root_lp[row] if is_root else lp[row] for is_root, row in sel])
            if req.index in self.drawn:
                out.append(self._draw(req, dist))
                continue
            if self.vocab_limit is not None and self.vocab_limit < dist.shape[-1]:
                dist[:, self.vocab_limit:] = float("-inf")
            top = torch.topk(dist, k=min(req.k, dist.shape[-1]), dim=-1)
            out.append((top.indices.numpy(), top.values.double().numpy()))
        return out

    def _draw(self, req: Any, dist: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
        assert self.sampler is not None
        params, gen = self.drawn[req.index]
        q = self.sampler.q(dist, params)
        nodes, rows = self.q_rows.setdefault(req.index, ([], []))
        nodes.extend(req.node_ids)
        rows.append(q)
        return self.sampler.draw(q, req.k, gen)

    def draft_probs(self, index: int, num_nodes: int) -> DraftProbs:
        """The q rows of request ``index``'s sampled tree (builder ids = tree indices)."""
        nodes, rows = self.q_rows.get(index, ([], []))
        node_rows = np.full(num_nodes, -1, dtype=np.int64)
        ids = np.asarray(nodes, dtype=np.int64)
        keep = ids < num_nodes
        node_rows[ids[keep]] = np.nonzero(keep)[0]
        width = self.vocab_limit or self.root_lp.shape[-1]
        probs = torch.cat(rows) if rows else torch.zeros((0, width))
        return DraftProbs(node_rows, probs)
