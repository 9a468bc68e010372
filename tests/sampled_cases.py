"""Shared cases of the sampled-output e2e tests (tree drafts and draft-model drafts): a random
Qwen3 with a 16-token vocabulary served from token-id prompts full of repeats; 5000 seeded
requests per case sample 8 tokens, and the counts of their first 4 are tested against the exact
distribution of 4-token continuations, enumerated in float64 with vLLM's temperature / top-p
processing (verify/sampling_params.py). The 4 tokens past the tested ones keep the trees over
the tested positions full size: the proposer drafts nothing max_tokens would cut."""
from __future__ import annotations

import collections

import numpy as np
import torch

from support.verify_cases import chi_square_pvalue
from vllm_treespec.verify import SamplingParamsBatch
from vllm_treespec.verify.sampling_params import target_probs

SAMPLES = 5000
LENGTH = 4                  # tokens whose joint law is tested
MAX_TOKENS = LENGTH + 4     # tokens each request samples
# every token recurs with several different successors: the trees branch at the root
PROMPT = np.random.default_rng(5).integers(0, 16, 48).tolist()
CASES = {"t1": dict(temperature=1.0), "t1-top-p-0.9": dict(temperature=1.0, top_p=0.9)}
# No chunked prefill: vLLM 0.32.0 rewinds a seeded request's generator when its partial-prefill
# token is discarded, which CPU generators do not support (RuntimeError in _bookkeeping_sync).
ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=128, max_num_seqs=128, seed=0,
              skip_tokenizer_init=True, enable_chunked_prefill=False)


def phases(repeat_seeded: bool) -> list[dict]:
    phases = []
    for name, sp in CASES.items():
        sampling = [dict(sp, max_tokens=MAX_TOKENS, ignore_eos=True, detokenize=False, seed=i)
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




def check_distribution(model_dir, result: dict, case: str) -> None:
    """The first 4 tokens of the case's continuations follow the exact target law (chi-square,
    p > 1e-3)."""
    exact = exact_distribution(model_dir, PROMPT, LENGTH, CASES[case])
    keys = {k: i for i, k in enumerate(exact)}
    expected = {i: exact[k] for k, i in keys.items()}
    outs = next(p["outputs"] for p in result["phases"] if p["name"] == case)
    assert all(len(o["token_ids"]) == MAX_TOKENS for o in outs)
    seqs = [tuple(o["token_ids"][:LENGTH]) for o in outs]
    counts = collections.Counter(keys.get(s, -1) for s in seqs)
    stat, dof, p = chi_square_pvalue(counts, expected)
    assert dof >= 10, "too few cells for a meaningful test"
    assert p > 1e-3, f"{case}: chi2={stat:.1f} dof={dof} p={p:.2e}"


def check_seeded_repeats(result: dict) -> None:
    """The first 500 seeded requests of each case, run again, give the same tokens."""
    outs = {p["name"]: p["outputs"] for p in result["phases"]}
    for case in CASES:
        first = [o["token_ids"] for o in outs[case][:500]]
        assert first == [o["token_ids"] for o in outs[case + "-again"]]
