"""Seeded sampled requests give the same tokens whatever else the engine serves with them.

Prompt lookup (chains, target-only rule): the same seeded requests run one
at a time (concurrency 1) and eight at a time, next to requests that ask for logprobs (vLLM's
sampler then runs over the whole batch in the same steps, advancing vLLM's generator of every
seeded request) and requests with other seeds (or the same seed). Tree acceptance draws from its
own generator per seeded request, with the same coin layout in every mode
(engine/tree_verifier.py), so the seeded tokens match. The same with lookup-online, whose trie
learns other requests' outputs: seeded requests draft without that online layer.

A draft model that samples its trees (q rows: recursive rejection sampling, the batch runs
accept() in "rrs" mode): the claim is narrower. A request's q comes from the draft model's
batched forward, whose float32 rounding can differ in the last bits between drafter batches
(drafters/draft_sampling.py), which can flip a near-tied draw; CI once saw it among 500 seeded
requests. So here the drafter's batch stays the same: four seeded requests at a time, alone and
then each next to a logprobs request (vLLM serves those, so they never reach the drafter, but
they make every step a mixed one). What is shown: mixed steps in an rrs batch leave the seeded
tokens alone. Neighbours with other seeds would join the drafter's batch; the prompt-lookup case
and tests/test_seeded_independence.py cover them (and requests without q rows next to ones with
q rows).

Both cases share one residual assumption: the target's own batched forward rounds alike in
both batchings, or differs too little to flip a draw (a near-tie needs a coin within ~1e-7 of
a threshold). Budgets are fixed and far below the scheduler's token budget, so no tree is cut
by load.
"""
from __future__ import annotations

import pytest

from e2e import run_engine, spec_config
from sampled_cases import ENGINE, PROMPT

pytestmark = [pytest.mark.e2e]

SEEDED = 8            # seeded requests under test
MAX_TOKENS = 10
PROMPT_LOOKUP = dict(speculative_config=spec_config(6), additional_config={"treespec": "prompt-lookup"})
LOOKUP_ONLINE = dict(speculative_config=spec_config(6), additional_config={"treespec": "lookup-online"})


def _seeded(i: int) -> dict:
    return dict(temperature=(1.0, 0.7)[i % 2], seed=100 + i, max_tokens=MAX_TOKENS, ignore_eos=True,
                detokenize=False)


NEIGHBOUR = dict(temperature=0.9, max_tokens=MAX_TOKENS + 6, ignore_eos=True, detokenize=False)


def _mixed_neighbour(i: int) -> dict:
    """Every other neighbour asks for logprobs (vLLM samples it: mixed steps); the others sample
    with their own seeds (some with the seed of a request under test). They run longer than the
    seeded requests, so every step of those has neighbours."""
    if i % 2 == 0:
        return dict(NEIGHBOUR, logprobs=1, seed=100 + i)
    return dict(NEIGHBOUR, seed=100 + i if i % 4 == 1 else 900 + i)


def _logprobs_neighbour(i: int) -> dict:
    return dict(NEIGHBOUR, logprobs=1, seed=100 + i)


def _phases(alone_concurrency: int, neighbour) -> list[dict]:
    """'alone': the seeded requests by themselves, `alone_concurrency` at a time; 'mixed': waves
    of 8, four seeded requests each next to a neighbour."""
    prompts = [PROMPT[i:] + PROMPT[:i] for i in range(SEEDED)]      # the same repetitive tokens
    alone = {"name": "alone", "concurrency": alone_concurrency, "prompts": prompts,
             "sampling": [_seeded(i) for i in range(SEEDED)]}
    mixed_prompts, mixed_sampling = [], []
    for i in range(SEEDED):
        mixed_prompts += [prompts[i], PROMPT[::-1]]
        mixed_sampling += [_seeded(i), neighbour(i)]
    mixed = {"name": "mixed", "concurrency": 8, "prompts": mixed_prompts, "sampling": mixed_sampling}
    return [alone, mixed]


def _check(result: dict) -> None:
    phases = {p["name"]: p["outputs"] for p in result["phases"]}
    alone = [o["token_ids"] for o in phases["alone"]]
    mixed = [o["token_ids"] for o in phases["mixed"][0::2]]
    assert all(len(t) == MAX_TOKENS for t in alone)
    for i, (a, b) in enumerate(zip(alone, mixed)):
        assert a == b, f"seeded request {i} (seed {100 + i}): {a} alone, {b} next to others"
    assert len({tuple(t) for t in alone}) == SEEDED                 # the seeds do sample
    lp = [o for o in phases["mixed"][1::2] if o["num_logprobs"] is not None]
    assert lp and all(o["num_logprobs"] == MAX_TOKENS + 6 for o in lp)   # vLLM served them
    state = result["proposer"][0]
    stats = state["stats"]
    assert stats["verified_trees"] > 0 and stats["accepted"] > 0
    assert stats["verify_steps"] > stats["own_steps"] > 0             # own and mixed steps ran
    assert not any(state["tables"].values()), state["tables"]       # generators freed too


def test_prompt_lookup_seeded_requests_ignore_their_batch(tiny_vocab_model):
    _check(run_engine(tiny_vocab_model, {**ENGINE, **PROMPT_LOOKUP}, _phases(1, _mixed_neighbour),
                      inspect_proposer=True))


def test_lookup_online_seeded_requests_ignore_what_the_trie_learnt(tiny_vocab_model):
    """lookup-online learns every finished output: by the mixed phase its online layer holds the
    alone phase's outputs and the neighbours'. Seeded requests draft without it (their own text
    only), so they sample the same tokens as alone."""
    result = run_engine(tiny_vocab_model, {**ENGINE, **LOOKUP_ONLINE}, _phases(1, _mixed_neighbour),
                        inspect_proposer=True)
    _check(result)
    assert result["proposer"][0]["drafter"]["online_observed_tokens"] > 0


def test_sampled_draft_seeded_requests_ignore_their_batch(tiny_vocab_model, noisy_draft):
    drafter = {"type": "draft_model", "path": str(noisy_draft), "max_cached_requests": 32,
               "memory_mb": 128, "draft_sampling": "sample"}
    spec = dict(speculative_config=spec_config(6),
                additional_config={"treespec": {"drafter": drafter,
                                                "tree": {"builder": "static", "template": [3, 2, 1]}}})
    result = run_engine(tiny_vocab_model, {**ENGINE, **spec}, _phases(4, _logprobs_neighbour),
                        inspect_proposer=True)
    _check(result)
    assert result["proposer"][0]["drafter"]["sampled_trees"] > 0     # q rows: rrs verification
