"""DART head serving end to end: greedy outputs with a DART head drafting trees equal speculation
off, at concurrency 1 and 8, for several tree builders; the head reads the target's aux hidden
states through vLLM's EAGLE-3 hook. The head here is random (losslessness must not depend on
draft quality); the fixture head's acceptance is what the benchmark measures."""
from __future__ import annotations

import pytest
import torch

from e2e import assert_same_outputs, greedy, run_engine, spec_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=512, max_num_seqs=8, seed=0)
PROMPTS = ["def fibonacci(n):\n    ", "import os\nimport sys\n\nclass Config:\n",
           "for i in range(10):\n    print(i)\n" * 3, "x = [1, 2, 3]\ny = "] * 2
BUILDERS = {"best_first": {"builder": "best_first", "max_depth": 4},
            "chain": {"builder": "chain"},
            "static": {"builder": "static", "template": [2, 2, 1]}}


@pytest.fixture(scope="module")
def random_head(tiny_model, tmp_path_factory):
    from transformers import AutoModelForCausalLM

    from vllm_treespec.drafters.heads.checkpoint import save_head
    from vllm_treespec.drafters.heads.dart import DartConfig, DartHead, eagle3_layers

    target = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    c = target.config
    cfg = DartConfig(hidden_size=c.hidden_size, vocab_size=c.vocab_size, target_num_layers=c.num_hidden_layers,
                     feature_layers=eagle3_layers(c.num_hidden_layers), depth=4, num_heads=4, num_kv_heads=2,
                     head_dim=32, intermediate_size=128)
    torch.manual_seed(0)
    head = DartHead(cfg, target.get_input_embeddings())
    return save_head(head, tmp_path_factory.mktemp("dart-head"))


def _phases():
    return [{"name": f"c{c}", "concurrency": c, "prompts": PROMPTS,
             "sampling": [greedy(24)] * len(PROMPTS)} for c in (1, 8)]


@pytest.fixture(scope="module")
def runs(tiny_model, random_head):
    out = {"off": run_engine(tiny_model, ENGINE, _phases())}
    for name, tree in BUILDERS.items():
        spec = dict(speculative_config=spec_config(6), additional_config={"treespec": {
            "drafter": {"type": "dart", "path": str(random_head), "topk": 4}, "tree": tree}})
        out[name] = run_engine(tiny_model, {**ENGINE, **spec}, _phases(), inspect_proposer=True)
    return out


@pytest.mark.parametrize("builder", list(BUILDERS))
def test_dart_greedy_equals_spec_off(runs, builder):
    assert_same_outputs(runs["off"], runs[builder])
    state = runs[builder]["proposer"][0]
    assert state["stats"]["verified_trees"] > 0           # the head drafted and trees were verified
    assert state["drafter"]["cached_requests"] == 0       # caches freed when requests finished


TRAINED = {"chain": {"builder": "chain"}, "best_first": {"builder": "best_first", "max_depth": 8},
           "preset": None}      # configs/drafters/dart.yaml as shipped (DART beam + n-gram rho)


@pytest.fixture(scope="module")
def trained_runs(code_lm_model):
    """The code-LM fixture served with its trained fixture head (held-out code prompts)."""
    from vllm_treespec.fixtures import build_fixture
    from vllm_treespec.fixtures.corpus import held_out_prompts

    head = build_fixture("dart-head")
    prompts = held_out_prompts(8, 400, seed=3)
    phases = [{"name": "c8", "concurrency": 8, "prompts": prompts, "sampling": [greedy(48)] * len(prompts)}]
    engine = dict(ENGINE, max_model_len=1024)
    out = {"off": run_engine(code_lm_model, engine, phases)}
    for name, tree in TRAINED.items():
        treespec = "dart" if tree is None else {"drafter": {"type": "dart", "path": str(head)}, "tree": tree}
        spec = dict(speculative_config=spec_config(8), additional_config={"treespec": treespec})
        out[name] = run_engine(code_lm_model, {**engine, **spec}, phases, inspect_proposer=True)
    return out


@pytest.mark.parametrize("builder", list(TRAINED))
def test_trained_head_is_accepted_when_served(trained_runs, builder):
    """Equal outputs, and the head trained on HF features is accepted on vLLM's aux features:
    a misaligned feature layer or position would leave it guessing (about 0 accepted)."""
    assert_same_outputs(trained_runs["off"], trained_runs[builder])
    stats = trained_runs[builder]["proposer"][0]["stats"]
    print(builder, stats["mean_accepted"], stats["verified_trees"])
    assert stats["mean_accepted"] > 1.0


# 20 blocks of 32 tokens for 8 requests of ~100 + 96 tokens: the scheduler must preempt; each
# prompt is sent twice, so the second copy hits vLLM's prefix cache (the head cache starts late)
TINY_KV = dict(dtype="float32", enforce_eager=True, max_model_len=512, max_num_seqs=8, seed=0,
               block_size=32, num_gpu_blocks_override=20, enable_prefix_caching=True)


@pytest.fixture(scope="module")
def preempt_runs(tiny_model, random_head):
    from vllm_treespec.fixtures import corpus

    prompts = corpus.held_out_prompts(4, prompt_chars=300, seed=11) * 2
    phases = [{"name": "preemption", "concurrency": 8, "prompts": prompts, "sampling": [greedy(96)] * 8}]
    spec = dict(speculative_config=spec_config(6), additional_config={"treespec": {
        "drafter": {"type": "dart", "path": str(random_head), "topk": 4}, "tree": BUILDERS["best_first"]}})
    return {"off": run_engine(tiny_model, TINY_KV, phases),
            "on": run_engine(tiny_model, {**TINY_KV, **spec}, phases, inspect_proposer=True)}


def test_dart_greedy_equal_under_preemption_and_prefix_caching(preempt_runs):
    assert preempt_runs["on"]["metrics"].get("vllm:num_preemptions", 0) > 0, "KV cache did not force preemption"
    assert_same_outputs(preempt_runs["off"], preempt_runs["on"])
    assert preempt_runs["on"]["proposer"][0]["drafter"]["cached_requests"] == 0
