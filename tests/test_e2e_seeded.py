"""Seeded sampled requests give the same tokens whatever else the engine serves with them.

The same seeded requests run one at a time (concurrency 1) and eight at a time, next to
requests that ask for logprobs (vLLM's sampler then runs over the whole batch in the same steps,
advancing vLLM's generator of every seeded request) and requests with other seeds. Two drafters:
prompt lookup (the default preset: chains, target-only rule) and a draft model that samples its
trees (q rows: its requests are verified by recursive rejection sampling, and the batch runs
accept() in "rrs" mode). Tree acceptance draws from its own generator per seeded request with
the same coin layout in every mode (engine/tree_verifier.py), so the seeded tokens match.

What the draft-model case claims is narrower: a request's drafts come from the draft model's
batched forward, whose float32 rounding can differ in the last bits between batch compositions
(drafters/draft_sampling.py), and so can the target's (both drafters): a near-tie in a draw or
acceptance test could then flip. Such ties need a coin within ~1e-7 of a threshold, so the few
hundred draws here never meet one in practice; a systematic dependence on the batch (a shifted
coin layout, a shared generator) changes nearly every request, which is what this test catches.
Budgets are fixed and far below the scheduler's token budget, so no tree is cut by load.
"""
from __future__ import annotations

import pytest
import torch

from e2e import run_engine, spec_config
from sampled_cases import ENGINE, PROMPT

pytestmark = [pytest.mark.e2e]

SEEDED = 8            # seeded requests under test
MAX_TOKENS = 10
PROMPT_LOOKUP = dict(speculative_config=spec_config(6), additional_config={"treespec": "prompt-lookup"})


def _seeded(i: int) -> dict:
    return dict(temperature=(1.0, 0.7)[i % 2], seed=100 + i, max_tokens=MAX_TOKENS, ignore_eos=True,
                detokenize=False)


def _neighbour(i: int) -> dict:
    """Every other neighbour asks for logprobs (vLLM samples it: mixed steps); the others sample
    with their own seeds (one of them the seed of a request under test). They run longer than the
    seeded requests, so every step of those has neighbours."""
    sp = dict(temperature=0.9, max_tokens=MAX_TOKENS + 6, ignore_eos=True, detokenize=False)
    if i % 2 == 0:
        return dict(sp, logprobs=1, seed=100 + i)
    return dict(sp, seed=100 + i if i % 4 == 1 else 900 + i)


def _phases() -> list[dict]:
    prompts = [PROMPT[i:] + PROMPT[:i] for i in range(SEEDED)]      # the same repetitive tokens
    alone = {"name": "c1", "concurrency": 1, "prompts": prompts,
             "sampling": [_seeded(i) for i in range(SEEDED)]}
    mixed_prompts, mixed_sampling = [], []
    for i in range(SEEDED):          # waves of 8: 4 seeded requests, each next to a neighbour
        mixed_prompts += [prompts[i], PROMPT[::-1]]
        mixed_sampling += [_seeded(i), _neighbour(i)]
    mixed = {"name": "c8", "concurrency": 8, "prompts": mixed_prompts, "sampling": mixed_sampling}
    return [alone, mixed]


def _seeded_tokens(result: dict) -> dict[str, list[list[int]]]:
    phases = {p["name"]: p["outputs"] for p in result["phases"]}
    return {"c1": [o["token_ids"] for o in phases["c1"]],
            "c8": [o["token_ids"] for o in phases["c8"][0::2]]}


def _check(result: dict) -> None:
    tokens = _seeded_tokens(result)
    assert all(len(t) == MAX_TOKENS for t in tokens["c1"])
    for i, (a, b) in enumerate(zip(tokens["c1"], tokens["c8"])):
        assert a == b, f"seeded request {i} (seed {100 + i}): {a} alone, {b} in a batch"
    assert len({tuple(t) for t in tokens["c1"]}) == SEEDED          # the seeds do sample
    lp = result["phases"][1]["outputs"][1::2][0::2]
    assert all(o["num_logprobs"] == MAX_TOKENS + 6 for o in lp)     # vLLM served them
    state = result["proposer"][0]
    stats = state["stats"]
    assert stats["verified_trees"] > 0 and stats["accepted"] > 0
    assert stats["verify_steps"] > stats["own_steps"] > 0             # own and mixed steps ran
    assert not any(state["tables"].values()), state["tables"]       # generators freed too


def test_prompt_lookup_seeded_requests_ignore_their_batch(tiny_vocab_model):
    _check(run_engine(tiny_vocab_model, {**ENGINE, **PROMPT_LOOKUP}, _phases(), inspect_proposer=True))


@pytest.fixture(scope="module")
def noisy_draft(tiny_vocab_model, tmp_path_factory):
    """The target with noisy weights (as in test_e2e_draft_sampling.py): drafts that are often
    but not always accepted."""
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(str(tiny_vocab_model), torch_dtype=torch.float32)
    gen = torch.Generator().manual_seed(17)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.5 * p.std().clamp(min=1e-3))
    out = tmp_path_factory.mktemp("noisy-draft")
    model.save_pretrained(str(out), safe_serialization=True)
    return out


def test_sampled_draft_seeded_requests_ignore_their_batch(tiny_vocab_model, noisy_draft):
    drafter = {"type": "draft_model", "path": str(noisy_draft), "max_cached_requests": 32,
               "memory_mb": 128, "draft_sampling": "sample"}
    spec = dict(speculative_config=spec_config(6),
                additional_config={"treespec": {"drafter": drafter,
                                                "tree": {"builder": "static", "template": [3, 2, 1]}}})
    result = run_engine(tiny_vocab_model, {**ENGINE, **spec}, _phases(), inspect_proposer=True)
    _check(result)
    assert result["proposer"][0]["drafter"]["sampled_trees"] > 0     # q rows: rrs verification
