"""`drafter.sampled_path` end to end (offline `LLM`, CPU, the code-LM fixture in float32): a
lookup-trie deployment with a second trie for sampled requests. Greedy requests draft from
`path` and stay bitwise equal to speculation off, also when they share steps with sampled
requests; sampled requests draft from `sampled_path` (the drafter picks by each request's own
temperature, so a seeded request's trees, and with them its tokens, do not depend on its
neighbours: the same tokens alone and in a mixed batch)."""
from __future__ import annotations

import pytest

from e2e import assert_same_outputs, greedy, run_engine, spec_config
from vllm_treespec.train import corpus

pytestmark = [pytest.mark.e2e]

ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=1024, max_num_seqs=16, seed=0,
              block_size=32, enable_prefix_caching=False, max_num_batched_tokens=512)
CONFIG = {"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram",
                      "sampled_path": "fixture:code-lm-distill-5gram"},
          "tree": {"builder": "best_first", "max_depth": 6}}
PROMPTS = corpus.held_out_prompts(8, prompt_chars=400, seed=21)
TOKENS = 24


def _seeded(i: int) -> dict:
    return dict(temperature=0.7, seed=300 + i, max_tokens=TOKENS, ignore_eos=True,
                detokenize=False)


def _phases() -> list[dict]:
    return [
        {"name": "sampled-alone", "concurrency": 1, "prompts": PROMPTS[:4],
         "sampling": [_seeded(i) for i in range(4)]},
        {"name": "mixed", "concurrency": 8, "prompts": PROMPTS[:4] + PROMPTS[4:],
         "sampling": [_seeded(i) for i in range(4)] + [greedy(TOKENS)] * 4},
        {"name": "greedy", "concurrency": 4, "prompts": PROMPTS[4:],
         "sampling": [greedy(TOKENS)] * 4},
    ]


@pytest.fixture(scope="module")
def runs(code_lm_model, code_lm_distilled_trie):
    spec = dict(speculative_config=spec_config(16), additional_config={"treespec": CONFIG})
    return {"off": run_engine(code_lm_model, ENGINE, _phases()),
            "tree": run_engine(code_lm_model, {**ENGINE, **spec}, _phases(), inspect_proposer=True)}


def _outputs(run: dict, phase: str) -> list[list[int]]:
    return [o["token_ids"] for o in {p["name"]: p["outputs"] for p in run["phases"]}[phase]]


def test_greedy_requests_stay_equal_to_speculation_off(runs):
    off, tree = runs["off"], runs["tree"]
    assert _outputs(tree, "mixed")[4:] == _outputs(off, "mixed")[4:]
    assert_same_outputs({"phases": [p for p in off["phases"] if p["name"] == "greedy"]},
                        {"phases": [p for p in tree["phases"] if p["name"] == "greedy"]})


def test_seeded_sampled_requests_ignore_their_neighbours(runs):
    tree = runs["tree"]
    alone, mixed = _outputs(tree, "sampled-alone"), _outputs(tree, "mixed")[:4]
    assert all(len(t) == TOKENS for t in alone)
    assert alone == mixed
    stats = tree["proposer"][0]["stats"]
    assert stats["verified_trees"] > 0 and stats["accepted"] > 0
