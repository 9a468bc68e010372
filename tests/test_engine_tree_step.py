"""Per-step tree planning and verification without an engine: what the runner patches compute."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from vllm_treespec.engine.tree_step import plan_tree_step
from vllm_treespec.engine.tree_verifier import accepted_moves, verify_step
from vllm_treespec.tree import DraftTree

# root 7; node 1 (tok 4) and node 2 (tok 5) children of root; node 3 (tok 6) child of node 2
TREE = DraftTree([7, 4, 5, 6], [-1, 0, 0, 2])


def _plan(trees=None, drafts=None, num_scheduled=None, computed=(10, 20, 30)):
    req_ids = ["a", "b", "c"]
    trees = {"a": TREE} if trees is None else trees
    drafts = {"a": [4, 5, 6]} if drafts is None else drafts
    if num_scheduled is None:
        num_scheduled = [len(drafts.get(r, [])) + 1 for r in req_ids]
    qsl = np.concatenate([[0], np.cumsum(num_scheduled)])
    return plan_tree_step(req_ids, np.array(num_scheduled), drafts, trees, qsl, np.array(computed))


def test_plan_positions_rows_and_logits():
    step = _plan(trees={"a": TREE, "c": DraftTree.chain(9, [1, 2])},
                 drafts={"a": [4, 5, 6], "c": [1, 2]})
    # batch: a = rows 0..3, b = row 4 (no drafts), c = rows 5..7
    assert step.req_indices.tolist() == [0, 2] and step.req_ids == ["a", "c"]
    assert step.node_rows.tolist() == [0, 1, 2, 3, 5, 6, 7]
    assert step.positions.tolist() == [10, 11, 11, 12, 30, 31, 32]   # num_computed + depth
    assert step.logit_rows.tolist() == [0, 1, 2, 3, 5, 6, 7]
    assert step.max_num_draft == 3 and not step.has_foreign_drafts
    # only rows off the first chain need the mask (nodes 2 and 3 of a); chains keep the stock kernel
    assert step.attn.req_indices.tolist() == [0] and step.attn.tree_sizes.tolist() == [4]
    assert step.attn.rows.tolist() == [2, 3] and step.attn.offsets.tolist() == [0, 2]
    assert step.attn.prefix_lens.tolist() == [10]
    assert step.attn.anc_mask[:, 0].tolist() == [0b101, 0b1101]


def test_plan_cuts_tree_to_scheduled_prefix():
    step = _plan(drafts={"a": [4, 5]})
    assert step.trees.tokens.tolist() == [7, 4, 5] and step.positions.tolist() == [10, 11, 11]


def test_unknown_or_mismatched_drafts_verify_as_chain():
    step = _plan(drafts={"a": [4, 6, 6]})          # not our tree's tokens
    assert step.trees.parents.tolist() == [-1, 0, 1, 2] and step.attn is None
    step = _plan(trees={}, drafts={"a": [4, 5, 6]})
    assert step.positions.tolist() == [10, 11, 12, 13]


def test_vllm_padding_drafts_are_left_to_vllm():
    step = _plan(drafts={"a": [4, 5, 6], "b": [-1, -1]})
    assert step.req_ids == ["a"] and step.has_foreign_drafts
    assert step.logit_rows.tolist() == [0, 1, 2, 3]          # b still owns 3 logits rows after a


def test_no_drafts_plan_has_no_trees():
    step = _plan(drafts={})
    assert step.num_trees == 0 and step.attn is None and step.max_num_draft == 0
    assert step.first_logit.tolist() == [0, 1, 2]
    tokens, _ = verify_step(step, _logits_choosing(3, {0: 4, 1: 5, 2: 6}), _greedy_params(3),
                            [None] * 3, include=None, base=None)
    assert tokens.tolist() == [[4], [5], [6]]


def _logits_choosing(rows: int, choice: dict[int, int], vocab: int = 16) -> torch.Tensor:
    logits = torch.zeros(rows, vocab)
    for r, tok in choice.items():
        logits[r, tok] = 5.0
    return logits


def _greedy_params(n):
    from vllm import SamplingParams

    return [SamplingParams(temperature=0.0) for _ in range(n)]


def test_verify_own_mode_accepts_branch_and_moves_kv():
    step = _plan()
    # logits rows: a -> 0..3, b -> 4, c -> 5. Target at root picks 5 (node 2), at node 2 picks 6
    # (node 3), at node 3 picks 9 (bonus). b samples 3, c samples 2.
    logits = _logits_choosing(6, {0: 5, 2: 6, 3: 9, 4: 3, 5: 2, 1: 1})
    tokens, res = verify_step(step, logits, _greedy_params(3), [None] * 3, include=None, base=None)
    assert tokens.tolist() == [[5, 6, 9, -1], [3, -1, -1, -1], [2, -1, -1, -1]]
    step.slot_mapping = torch.tensor([100, 101, 102, 103])
    src, dst = accepted_moves(step, res.accepted_nodes[torch.from_numpy(step.req_indices)])
    assert src.tolist() == [102, 103] and dst.tolist() == [101, 102]  # nodes 2, 3 -> positions 1, 2


def test_verify_mixed_mode_overwrites_only_tree_rows():
    step = _plan()
    logits = _logits_choosing(6, {0: 4, 1: 8})
    base = torch.tensor([[1, 1, 1, 1], [3, -1, -1, -1], [2, -1, -1, -1]])
    tokens, res = verify_step(step, logits, _greedy_params(1), [None], include=np.array([0]), base=base)
    assert tokens.tolist() == [[4, 8, -1, -1], [3, -1, -1, -1], [2, -1, -1, -1]]
    step.slot_mapping = torch.tensor([100, 101, 102, 103])
    src, dst = accepted_moves(step, res.accepted_nodes)
    assert src.numel() == 0                                           # node prefix: nothing moves
    with pytest.raises(RuntimeError, match="expected"):
        verify_step(step, logits, _greedy_params(1), [None], include=np.array([0]), base=base[:, :2])


def test_chain_shaped_steps_need_no_position_rewrite_or_slots():
    """The `_prepare_inputs` patch rewrites positions and gathers slots only when `attn` lists
    off-chain nodes: for chain-shaped steps positions equal vLLM's num_computed + index and no
    accepted path can move K/V, so compaction works without a slot mapping."""
    step = _plan(trees={"a": DraftTree.chain(7, [4, 5, 6]), "c": DraftTree.chain(9, [1, 2])},
                 drafts={"a": [4, 5, 6], "c": [1, 2]})
    assert step.chain_shaped and step.attn is None and step.slot_mapping is None
    assert step.tree_sizes.tolist() == [4, 3]
    vllm_positions = np.concatenate([10 + np.arange(4), 30 + np.arange(3)])
    assert step.positions.tolist() == vllm_positions.tolist()
    logits = _logits_choosing(8, {0: 4, 1: 5, 2: 6, 3: 8, 4: 3, 5: 1, 6: 7})
    _, res = verify_step(step, logits, _greedy_params(3), [None] * 3, include=None, base=None)
    accepted = res.accepted_nodes.numpy()[step.req_indices]
    src, dst = accepted_moves(step, accepted)                 # full chain accepted: no moves
    assert src.numel() == 0 and dst.numel() == 0


def test_moves_without_slot_mapping_are_refused():
    step = _plan()                                            # branching: attn lists nodes 2, 3
    assert not step.chain_shaped
    accepted = np.array([[2, 3, -1]])                         # path leaves the first chain
    with pytest.raises(RuntimeError, match="slot mapping"):
        accepted_moves(step, accepted)


def test_sampled_requests_use_their_generators():
    from vllm import SamplingParams

    step = _plan()
    logits = torch.randn(6, 16)
    params = [SamplingParams(temperature=1.0, seed=1)] * 3

    def run():
        gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
        return verify_step(step, logits, params, gens, include=None, base=None, coin_rows=8)[0]

    assert torch.equal(run(), run())


def test_mixed_mode_verifies_eligible_rows_without_drafts_too():
    step = _plan()
    logits = _logits_choosing(6, {0: 5, 2: 6, 3: 9, 5: 2})
    base = torch.tensor([[1, 1, 1, 1], [3, -1, -1, -1], [7, -1, -1, -1]])
    # rows 0 (tree) and 2 (no drafts) are ours; row 1 stays vLLM's
    tokens, res = verify_step(step, logits, _greedy_params(2), [None] * 2, include=np.array([0, 2]),
                              base=base)
    assert tokens.tolist() == [[5, 6, 9, -1], [3, -1, -1, -1], [2, -1, -1, -1]]


def test_seeded_coins_do_not_depend_on_the_cut():
    """With a fixed coin block, a seeded request's stream moves the same whatever the cut."""
    from vllm import SamplingParams

    logits = torch.randn(6, 16)
    params = [SamplingParams(temperature=1.0, seed=1)] * 3
    after = []
    for drafts in ({"a": [4, 5, 6]}, {"a": [4]}):
        step = _plan(drafts=drafts)
        gens = [torch.Generator().manual_seed(s) for s in (1, 2, 3)]
        verify_step(step, logits[: step.first_logit[-1] + 1], params, gens, include=None, base=None,
                    coin_rows=8)
        after.append([torch.rand(1, generator=g).item() for g in gens])
    assert after[0] == after[1]


def test_eligibility_reasons():
    from vllm import SamplingParams

    from vllm_treespec.engine.eligibility import tree_blocker

    assert tree_blocker(SamplingParams(temperature=0.7, top_p=0.9, top_k=5, min_p=0.1, seed=3,
                                       stop=["x"]), 0) is None
    cases = {"logprobs": dict(logprobs=0), "penalties": dict(frequency_penalty=0.2),
             "bad_words": dict(bad_words=["x"]), "logit_bias": dict(logit_bias={1: 1.0}),
             "allowed_token_ids": dict(allowed_token_ids=[1])}
    for reason, kw in cases.items():
        assert tree_blocker(SamplingParams(**kw), 0) == reason
    assert tree_blocker(SamplingParams(min_tokens=4), 3) == "min_tokens"
    assert tree_blocker(SamplingParams(min_tokens=4), 4) is None
    assert tree_blocker(None, 0) == "no_sampling_params"


def test_greedy_walk_equals_the_torch_rule_on_random_trees():
    from support.greedy_reference import accept_greedy

    from vllm_treespec.verify import greedy_walk
    from support.verify_cases import random_tree_batch

    rng = np.random.default_rng(0)
    for trial in range(50):
        sizes = rng.integers(1, 40, size=int(rng.integers(1, 8))).tolist()
        tree = random_tree_batch(rng, sizes, vocab=6, max_children=3)
        logits = torch.randn(int(tree.offsets[-1]), 6, generator=torch.Generator().manual_seed(trial))
        ref = accept_greedy(tree, logits)
        width = ref.emitted.shape[1]
        walk = greedy_walk(tree, logits, width)
        assert torch.equal(walk.emitted, ref.emitted) and torch.equal(walk.accepted_nodes, ref.accepted_nodes)


def test_step_batch_ancestor_words_match_walking_up_the_parents():
    """The step batch's masks (the one implementation, tree/ancestors.py) against a walk up
    each node's parents, for trees wider than one 64-bit word."""
    from vllm_treespec.tree import TreeBatch

    rng = np.random.default_rng(1)
    trees = []
    for n in (1, 5, 70, 130):
        parents = [-1] + [int(rng.integers(i)) for i in range(1, n)]
        trees.append(DraftTree(np.arange(n), parents))
    words = TreeBatch.from_trees(trees).anc_mask.numpy().view(np.uint64)
    row = 0
    for tree in trees:
        for node in range(tree.num_nodes):
            want = set()
            j = node
            while j >= 0:
                want.add(j)
                j = int(tree.parents[j])
            got = {w * 64 + bit for w in range(words.shape[1]) for bit in range(64)
                   if (int(words[row, w]) >> bit) & 1}
            assert got == want, (tree.num_nodes, node)
            row += 1


def _draft_probs(node_rows, vocab=16, seed=0):
    from vllm_treespec.drafters.draft_sampling import DraftProbs

    m = int(max(node_rows)) + 1
    probs = torch.softmax(torch.randn(m, vocab, generator=torch.Generator().manual_seed(seed)), -1)
    return DraftProbs(np.asarray(node_rows, dtype=np.int64), probs)


def _plan_q(drafts, probs):
    req_ids = ["a", "b", "c"]
    trees = {"a": TREE, "c": TREE}
    num_scheduled = [len(drafts.get(r, [])) + 1 for r in req_ids]
    qsl = np.concatenate([[0], np.cumsum(num_scheduled)])
    return plan_tree_step(req_ids, np.array(num_scheduled), drafts, trees, qsl, np.array((10, 20, 30)),
                          probs)


def test_plan_maps_draft_q_rows_through_the_cut():
    a, c = _draft_probs([0, -1, 1, -1]), _draft_probs([0, 1, 2, -1], seed=1)
    step = _plan_q({"a": [4, 5, 6], "c": [4, 5]}, {"a": a, "c": c})
    assert step.q_rows.tolist() == [0, -1, 1, -1] + [2, 3, 4]       # c's rows after a's two
    assert torch.equal(step.q_probs, torch.cat([a.probs, c.probs]))
    step = _plan_q({"a": [4, 6, 6], "c": [4]}, {"a": a})              # a: not our tree; c: no q
    assert step.q_rows is None and step.q_probs is None
    assert _plan_q({"a": [4, 5, 6]}, None).q_rows is None


def test_verify_uses_rrs_exactly_when_sampled_nodes_have_q(monkeypatch):
    from vllm import SamplingParams

    from vllm_treespec.verify import decide

    calls = []

    def spy(rule):
        real = getattr(decide, rule)

        def call(*args, **kwargs):
            calls.append((rule, kwargs))
            return real(*args, **kwargs)
        return call

    for rule in ("accept_rrs", "accept_target_only"):
        monkeypatch.setattr(decide, rule, spy(rule))
    step = _plan_q({"a": [4, 5, 6]}, {"a": _draft_probs([0, -1, 1, -1])})
    logits = torch.randn(6, 16)
    sampled = [SamplingParams(temperature=1.0)] * 3
    verify_step(step, logits, sampled, [None] * 3, include=None, base=None, coin_rows=8)
    rule, kw = calls.pop()
    assert rule == "accept_rrs" and kw["replacement"] is False
    assert kw["draft_rows"].tolist() == [0, -1, 1, -1, -1, -1]          # b, c: root-only trees
    verify_step(_plan(), logits, sampled, [None] * 3, include=None, base=None, coin_rows=8)
    assert calls.pop()[0] == "accept_target_only"                       # top-k trees: no q rows
    verify_step(step, logits, _greedy_params(3), [None] * 3, include=None, base=None)
    assert not calls                                                    # all greedy: the C++ walk


def test_one_request_step_matches_its_plan_inside_a_batch():
    """One request per step takes the no-concatenation paths; its plan is the batched one's."""
    alone = plan_tree_step(["a"], np.array([4]), {"a": [4, 5, 6]}, {"a": TREE}, np.array([0, 4]),
                           np.array([10]))
    batched = _plan()
    assert alone.trees.tokens.tolist() == batched.trees.tokens.tolist() == TREE.tokens.tolist()
    assert alone.trees.offsets.tolist() == [0, 4]
    assert alone.node_rows.tolist() == batched.node_rows.tolist() == [0, 1, 2, 3]
    assert alone.positions.tolist() == batched.positions.tolist() == [10, 11, 11, 12]
    assert alone.attn.rows.tolist() == batched.attn.rows.tolist() == [2, 3]
    assert np.array_equal(alone.attn.anc_mask.numpy(), batched.attn.anc_mask.numpy())
    assert alone.logit_rows.tolist() == [0, 1, 2, 3] and alone.max_num_draft == 3


def test_step_keeps_its_own_copy_of_the_runner_arrays():
    """The runner reuses its query_start_loc buffer next step; the plan read by sampling and by
    target-state drafters must not change under it."""
    qsl = np.array([0, 4, 5, 6])
    step = plan_tree_step(["a", "b", "c"], np.array([4, 1, 1]), {"a": [4, 5, 6]}, {"a": TREE}, qsl,
                          np.array([10, 20, 30]))
    qsl[:] = 99
    assert step.query_start_loc.tolist() == [0, 4, 5, 6]
    assert step.node_rows.tolist() == [0, 1, 2, 3]
