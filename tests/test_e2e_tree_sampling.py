"""Sampled outputs keep the target distribution with tree speculation (chi-square), and seeded
requests reproduce exactly across runs.

Fixture: a random Qwen3 with a 16-token vocabulary (peaked but not one-hot next-token
distributions), served without a tokenizer from token-id prompts full of repeats, so prompt
lookup drafts branching trees from several matches. For each case, 5000 requests sample 4 tokens
each with speculation off and with trees on; both are tested against the exact distribution of
4-token continuations, enumerated from the same weights in float64 with vLLM's temperature /
top-p processing (verify/sampling_params.py). The spec-off run is the control: it shows the
reference and the test are right, so a failure with trees on points at tree verification.
"""
from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from e2e import run_engine, spec_config
from vllm_treespec.verify import SamplingParamsBatch
from vllm_treespec.verify.sampling_params import target_probs
from vllm_treespec.verify.testing import chi_square_pvalue

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

SAMPLES = 5000
LENGTH = 4
# every token recurs with several different successors: the trees branch at the root
PROMPT = np.random.default_rng(5).integers(0, 16, 48).tolist()
CASES = {"t1": dict(temperature=1.0), "t1-top-p-0.9": dict(temperature=1.0, top_p=0.9)}
# No chunked prefill: vLLM 0.32.0 rewinds a seeded request's generator when its partial-prefill
# token is discarded, which CPU generators do not support (RuntimeError in _bookkeeping_sync).
ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=128, max_num_seqs=128, seed=0,
              skip_tokenizer_init=True, enable_chunked_prefill=False)
TREES = dict(speculative_config=spec_config(8),
             additional_config={"treespec": {"drafter": {"type": "prompt_lookup", "max_matches": 8},
                                             "tree": {"builder": "best_first"}}})


def _phases(repeat_seeded: bool) -> list[dict]:
    phases = []
    for name, sp in CASES.items():
        sampling = [dict(sp, max_tokens=LENGTH, ignore_eos=True, detokenize=False, seed=i)
                    for i in range(SAMPLES)]
        phases.append({"name": name, "concurrency": 0, "prompts": [PROMPT] * SAMPLES, "sampling": sampling})
        if repeat_seeded:
            phases.append({"name": name + "-again", "concurrency": 0, "prompts": [PROMPT] * 500,
                           "sampling": sampling[:500]})
    return phases


def exact_distribution(model_dir, prompt: list[int], length: int, sampling: dict) -> dict[tuple, float]:
    """P(continuation) for every continuation of `length` tokens, in float64."""
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(str(model_dir), torch_dtype=torch.float64).eval()
    params = SamplingParamsBatch.from_lists(temperature=[sampling.get("temperature", 1.0)],
                                            top_p=[sampling.get("top_p", 1.0)])
    level: dict[tuple, float] = {(): 1.0}
    for _ in range(length):
        seqs = list(level)
        ids = torch.tensor([prompt + list(s) for s in seqs])
        with torch.no_grad():
            logits = model(ids).logits[:, -1, :]
        probs = target_probs(logits.double(), params.rows(torch.zeros(len(seqs), dtype=torch.int64)))
        nxt: dict[tuple, float] = {}
        for s, row in zip(seqs, probs.double().numpy()):
            for tok in np.nonzero(row > 0)[0].tolist():
                nxt[s + (tok,)] = level[s] * float(row[tok])
        level = nxt
    return level


@pytest.fixture(scope="module")
def sampled(tiny_vocab_model):
    return {"off": run_engine(tiny_vocab_model, ENGINE, _phases(False)),
            "on": run_engine(tiny_vocab_model, {**ENGINE, **TREES}, _phases(True), inspect_proposer=True)}


@pytest.mark.parametrize("case", list(CASES))
def test_tree_sampling_matches_target_distribution(sampled, tiny_vocab_model, case):
    exact = exact_distribution(tiny_vocab_model, PROMPT, LENGTH, CASES[case])
    keys = {k: i for i, k in enumerate(exact)}
    expected = {i: exact[k] for k, i in keys.items()}
    for run in ("off", "on"):
        outs = next(p["outputs"] for p in sampled[run]["phases"] if p["name"] == case)
        seqs = [tuple(o["token_ids"]) for o in outs]
        assert all(len(s) == LENGTH for s in seqs)
        counts = collections.Counter(keys.get(s, -1) for s in seqs)
        stat, dof, p = chi_square_pvalue(counts, expected)
        assert dof >= 10, f"{run}: too few cells for a meaningful test"
        assert p > 1e-3, f"{run} {case}: chi2={stat:.1f} dof={dof} p={p:.2e}"


def test_trees_branched_and_accepted_while_sampling(sampled):
    stats = sampled["on"]["proposer"][0]["stats"]
    assert stats["verified_trees"] > 1000 and stats["accepted"] > 500
    assert stats["kv_moves"] > 0            # accepted paths left the node prefix: real branches


def test_seeded_requests_reproduce(sampled):
    phases = {p["name"]: p["outputs"] for p in sampled["on"]["phases"]}
    for case in CASES:
        first = [o["token_ids"] for o in phases[case][:500]]
        assert first == [o["token_ids"] for o in phases[case + "-again"]]
