"""A seeded sampled request's tokens, and the state its generator is left in, do not depend on
what shares its steps (no engine; the engine-level calls the proposer makes).

The seeded request is verified (1) alone, (2) next to requests whose trees carry drafter q rows
(the batch then runs accept() in "rrs" mode), (3) next to greedy requests and (4) in a mixed
step, next to a request vLLM's sampler serves (verify_step with include / base, after a stand-in
for vLLM's sampler has drawn from every request's vLLM generator). Two causes used to break
this: (2) changed the coin layout (two coins per node in "rrs" mode, one otherwise) and (4)
advanced the very generator acceptance drew from (vLLM's). The proposer-level test runs
`TreeProposer.sample` itself with a fake runner for (4).
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch

from vllm_treespec.drafters.draft_sampling import DraftProbs
from vllm_treespec.engine.tree_step import plan_tree_step
from vllm_treespec.engine.tree_verifier import acceptance_generators, verify_step
from vllm_treespec.tree import DraftTree

pytestmark = pytest.mark.usefixtures("one_torch_thread")

VOCAB = 16
K = 4                                      # num_speculative_tokens: coin block of K + 1 rows
TOPK = DraftTree([7, 4, 5, 6], [-1, 0, 0, 2])   # root -> 4, 5; 5 -> 6 (a top-k tree, no q)
SEEDS = 250                                # per (temperature, tree) case: 1000 in all


def _params(temperature: float, seed: int | None = None, **kw):
    from vllm import SamplingParams

    return SamplingParams(temperature=temperature, seed=seed, **kw)


def _q_rows(seed: int) -> DraftProbs:
    """q rows of a sampled TOPK-shaped tree: the root's and node 2's children drawn from q."""
    probs = torch.softmax(torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(seed)), -1)
    return DraftProbs(np.array([0, -1, 1, -1], dtype=np.int64), probs)


def _logits(rng: np.random.Generator, tree: DraftTree | None) -> torch.Tensor:
    """Target rows of one request's tree, with its draft tokens made likely so that walks
    accept, branch and reject."""
    if tree is None:
        return torch.tensor(rng.normal(0, 1.5, (1, VOCAB)), dtype=torch.float32)
    rows = rng.normal(0, 1.5, (tree.num_draft + 1, VOCAB))
    for node in range(1, tree.num_draft + 1):
        rows[int(tree.parents[node]), int(tree.tokens[node])] += 1.5
    return torch.tensor(rows, dtype=torch.float32)


def _step(batch: list[tuple[str, DraftTree | None, DraftProbs | None]]):
    """The plan the proposer makes for this batch (trees drafted last step, none cut)."""
    ids = [r for r, _, _ in batch]
    trees = {r: t for r, t, _ in batch if t is not None}
    drafts = {r: t.tokens[1:].tolist() for r, t in trees.items()}
    probs = {r: q for r, _, q in batch if q is not None}
    sched = np.array([len(drafts.get(r, [])) + 1 for r in ids])
    qsl = np.concatenate([[0], np.cumsum(sched)])
    return plan_tree_step(ids, sched, drafts, trees, qsl, np.full(len(ids), 10), probs)


def _verify(batch, logits: list[torch.Tensor], params: list, vllm_rows: tuple[int, ...] = ()):
    """Sample one step as TreeProposer.sample does; rows in vllm_rows are vLLM's (mixed step).
    Returns (token ids per request, the step plan, the acceptance generator table). A root-only
    request alone takes accept()'s root-only path, next to drafted requests the full walk."""
    step = _step(batch)
    ids = [r for r, _, _ in batch]
    table: dict[str, torch.Generator] = {}
    include, base = None, None
    if vllm_rows:
        # vLLM's sampler output; it drew from vLLM's generators, which acceptance never reads
        # (the proposer-level test below runs that part)
        include = np.array([i for i in range(len(ids)) if i not in vllm_rows], dtype=np.int64)
        base = torch.full((len(ids), step.max_num_draft + 1), -1, dtype=torch.int64)
        base[:, 0] = 3
    rows = range(len(ids)) if include is None else include.tolist()
    sub_ids, sub_params = [ids[i] for i in rows], [params[i] for i in rows]
    gens = acceptance_generators(table, sub_ids, sub_params)
    tokens, _ = verify_step(step, torch.cat(logits), sub_params, gens, include, base, coin_rows=K + 1)
    out = {r: [t for t in tokens[i].tolist() if t >= 0] for i, r in enumerate(ids)}
    return out, step, table


@pytest.mark.parametrize("temperature", [0.7, 1.0])
@pytest.mark.parametrize("shape", ["topk", "root_only"])
def test_seeded_request_ignores_its_batch(temperature, shape):
    tree = TOPK if shape == "topk" else None
    rng = np.random.default_rng(7)
    emitted, went_rrs = set(), 0
    for seed in range(SEEDS):
        s = _logits(rng, tree)
        sp = _params(temperature, seed)
        q1, q2 = _logits(rng, TOPK), _logits(rng, TOPK)
        g1, g2 = _logits(rng, TOPK), _logits(rng, None)
        v = _logits(rng, None)
        nb = _params(1.0, seed + 10_000)                        # a seeded neighbour
        runs = {
            "alone": _verify([("s", tree, None)], [s], [sp]),
            "rrs neighbours": _verify([("q1", TOPK, _q_rows(seed)), ("s", tree, None),
                                       ("q2", TOPK, _q_rows(seed + 1))],
                                      [q1, s, q2], [nb, sp, _params(0.9)]),
            "greedy neighbours": _verify([("g1", TOPK, None), ("s", tree, None), ("g2", None, None)],
                                         [g1, s, g2], [_params(0.0), sp, _params(0.0, seed=3)]),
            "mixed step": _verify([("v", None, None), ("s", tree, None), ("q1", TOPK, _q_rows(seed))],
                                  [v, s, q1], [_params(1.0, seed, logprobs=1), sp, nb],
                                  vllm_rows=(0,)),
        }
        went_rrs += runs["rrs neighbours"][1].q_rows is not None
        ref_tokens, _, ref_table = runs["alone"]
        ref_state = ref_table["s"].get_state()
        for name, (tokens, _, table) in runs.items():
            assert tokens["s"] == ref_tokens["s"], f"seed {seed}, {name}: tokens differ"
            assert torch.equal(table["s"].get_state(), ref_state), f"seed {seed}, {name}: generator"
        emitted.add(tuple(ref_tokens["s"]))
    assert went_rrs == SEEDS                                   # the neighbours did carry q rows
    assert len(emitted) > (30 if tree is not None else 10)     # the seeds really sample
    if tree is not None:
        assert any(len(t) > 1 for t in emitted) and any(len(t) == 1 for t in emitted)


def test_acceptance_generators_are_seeded_like_vllms_and_kept_per_request():
    table: dict[str, torch.Generator] = {}
    params = [_params(0.8, 11), _params(0.8), _params(0.0, 5), _params(1.0, 11)]
    gens = acceptance_generators(table, ["a", "b", "c", "d"], params)
    assert gens[1] is None and gens[2] is None                   # unseeded / greedy: no stream
    vllm_style = torch.Generator(device="cpu")                   # gpu_model_runner._update_states
    vllm_style.manual_seed(11)
    assert torch.equal(gens[0].get_state(), vllm_style.get_state())
    assert gens[0] is not gens[3] and set(table) == {"a", "d"}   # one per request, same seed or not
    torch.rand(3, generator=gens[0])
    again = acceptance_generators(table, ["a"], params[:1])
    assert again[0] is gens[0]                                   # created once, then reused


# -- TreeProposer.sample with a fake runner ----------------------------------------------------

def _proposer():
    from vllm_treespec.engine.proposer import TreeProposer

    return TreeProposer(SimpleNamespace(
        speculative_config=SimpleNamespace(num_speculative_tokens=K), additional_config={},
        model_config=SimpleNamespace(max_model_len=64, tokenizer=None, get_vocab_size=lambda: VOCAB),
        scheduler_config=SimpleNamespace(max_num_batched_tokens=2048, max_num_seqs=8),
        parallel_config=SimpleNamespace(tensor_parallel_size=1)))


def _runner(requests: dict[str, object]):
    """What TreeProposer.sample reads of vLLM's runner: its batch, each request's state (with
    vLLM's own seeded generator, seeded as vLLM does) and the device."""
    states = {}
    for r, sp in requests.items():
        gen = None
        if sp.seed is not None and sp.temperature >= 1e-5:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(sp.seed)
        states[r] = SimpleNamespace(sampling_params=sp, generator=gen, output_token_ids=[1, 2])
    return SimpleNamespace(input_batch=SimpleNamespace(req_ids=list(requests)), requests=states,
                           device=torch.device("cpu"))


def _vllm_sample(runner, step):
    """vLLM's sampler in a mixed step: one token per row, drawn from each request's vLLM
    generator (so it moves the seeded requests' vLLM streams, as vLLM's sampler does)."""
    def sample():
        width = step.max_num_draft + 1
        out = torch.full((step.num_reqs, width), -1, dtype=torch.int32)
        for i, r in enumerate(runner.input_batch.req_ids):
            out[i, 0] = int(torch.randint(VOCAB, (1,), generator=runner.requests[r].generator))
        return SimpleNamespace(sampled_token_ids=out, logprobs_tensors=None)
    return sample


def _serve(batch: dict[str, object], steps: list[dict[str, list[int] | None]], seed: int):
    """Run `steps` through TreeProposer.plan_step / sample; each step maps request -> its chain
    drafts (None = no drafts). Returns (s's tokens per step, s's acceptance generator state,
    proposer)."""
    p, runner = _proposer(), _runner(batch)
    rngs = {r: np.random.default_rng([seed, sum(map(ord, r))]) for r in batch}  # own logits each
    out = []
    for drafts in steps:
        ids = list(batch)
        for r in ids:
            if drafts.get(r):
                p.requests.trees[r] = DraftTree.chain(1, drafts[r])
        sched = np.array([len(drafts.get(r) or []) + 1 for r in ids])
        qsl = np.concatenate([[0], np.cumsum(sched)])
        step = p.plan_step(ids, sched, {r: d for r, d in drafts.items() if d}, qsl,
                           np.full(len(ids), 10))
        rows = [_logits(rngs[r], DraftTree.chain(1, drafts[r]) if drafts.get(r) else None)
                for r in ids]
        res = p.sample(runner, step, torch.cat(rows), _vllm_sample(runner, step))
        out.append([t for t in res.sampled_token_ids[ids.index("s")].tolist() if t >= 0])
    return out, p.requests.generators["s"].get_state(), p


def test_proposer_sample_keeps_the_seeded_stream_apart_from_vllms_sampler():
    """The seeded request 's' served alone (own steps) and next to a logprobs request (vLLM's
    sampler runs over the whole batch first, drawing from vLLM's generator of 's' too) and a
    request with another seed samples the same tokens and leaves its acceptance generator in
    the same state; the generator table is freed when the requests finish."""
    steps_s = [[4, 5, 6], None, [7, 8], [2, 3, 9, 1]]
    emitted = set()
    for seed in range(40):
        sp = _params(1.0, seed)
        alone, state_alone, _ = _serve({"s": sp}, [{"s": d} for d in steps_s], seed)
        mixed, state_mixed, p = _serve({"lp": _params(1.0, seed, logprobs=1), "s": sp,
                                        "n": _params(0.7, seed + 1)},
                                       [{"s": d, "n": [4, 4]} for d in steps_s], seed)
        emitted.add(tuple(map(tuple, alone)))
        assert mixed == alone, f"seed {seed}"
        assert torch.equal(state_mixed, state_alone), f"seed {seed}"
        assert set(p.requests.generators) == {"s", "n"}          # 'lp' is vLLM's
        p.on_requests_finished(["s", "lp", "n"])
        assert len(p.requests.generators) == 0 and p.tracked_requests()["requests"] == 0
    assert len(emitted) > 30                                    # the seeds really sample
