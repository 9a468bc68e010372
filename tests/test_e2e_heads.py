"""Learned-head serving end to end (DART, JetSpec causal, diffusion-style): greedy outputs with a
head drafting trees equal speculation off, at concurrency 1 and 8, for several tree builders; the
head reads the target's aux hidden states through vLLM's EAGLE-3 hook. Random heads check
losslessness (it must not depend on draft quality); the trained fixture heads must also be
accepted (> 1 token per step) when served, with each kind's shipped preset, where they are
cached (minutes of training each: a benchmark fixture's job, not CI's; conftest.trained_fixture)."""
from __future__ import annotations

import pytest
import torch

from conftest import trained_fixture, trained_fixture_available
from e2e import assert_same_outputs, greedy, run_engine, spec_config

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=512, max_num_seqs=8, seed=0)
PROMPTS = ["def fibonacci(n):\n    ", "import os\nimport sys\n\nclass Config:\n",
           "for i in range(10):\n    print(i)\n" * 3, "x = [1, 2, 3]\ny = "] * 2
# (head kind, builder[, drafter.dtype]) runs on random heads of the tiny model
BUILDERS = {"best_first": {"builder": "best_first", "max_depth": 4},
            "chain": {"builder": "chain"},
            "static": {"builder": "static", "template": [2, 2, 1]},
            "beam": {"builder": "beam", "topk": 3, "width": 3},
            "threshold": {"builder": "threshold", "branch": 2, "tau": 1e-6}}
# every builder with DART and with JetSpec heads; the diffusion head shares JetSpec's serving path
RANDOM_RUNS = [("dart", "best_first"), ("dart", "chain"), ("dart", "static"), ("dart", "beam"),
               ("dart", "threshold"), ("jetspec", "best_first"), ("jetspec", "chain"), ("jetspec", "static"),
               ("jetspec", "beam"), ("jetspec", "threshold"), ("diffusion", "best_first"),
               ("dart", "beam", "bfloat16"), ("jetspec", "best_first", "bfloat16")]   # drafter.dtype


def _random_head(tiny_model, out, kind):
    from transformers import AutoModelForCausalLM

    from vllm_treespec.drafters.heads.checkpoint import save_head
    from vllm_treespec.drafters.heads.dart import DartConfig, DartHead, eagle3_layers
    from vllm_treespec.drafters.heads.jetspec import JetSpecConfig, JetSpecHead

    target = AutoModelForCausalLM.from_pretrained(str(tiny_model), dtype=torch.float32)
    c = target.config
    shape = dict(hidden_size=c.hidden_size, vocab_size=c.vocab_size, target_num_layers=c.num_hidden_layers,
                 feature_layers=eagle3_layers(c.num_hidden_layers), depth=4, num_heads=4, num_kv_heads=2,
                 head_dim=32, intermediate_size=128)
    torch.manual_seed(0)
    if kind == "dart":
        head = DartHead(DartConfig(**shape), target.get_input_embeddings())
    else:
        within = "causal" if kind == "jetspec" else "bidirectional"
        head = JetSpecHead(JetSpecConfig(**shape, within_block=within), target.get_input_embeddings())
    return save_head(head, out)


@pytest.fixture(scope="module")
def random_heads(tiny_model, tmp_path_factory):
    return {kind: _random_head(tiny_model, tmp_path_factory.mktemp(f"{kind}-head"), kind)
            for kind in ("dart", "jetspec", "diffusion")}


def _phases():
    return [{"name": f"c{c}", "concurrency": c, "prompts": PROMPTS,
             "sampling": [greedy(24)] * len(PROMPTS)} for c in (1, 8)]


def _drafter(kind, path, dtype="auto"):
    return {"type": "dart" if kind == "dart" else "jetspec", "path": str(path), "topk": 4, "dtype": dtype}


@pytest.fixture(scope="module")
def runs(tiny_model, random_heads):
    out = {"off": run_engine(tiny_model, ENGINE, _phases())}
    for run in RANDOM_RUNS:
        kind, builder, *dtype = run
        spec = dict(speculative_config=spec_config(6), additional_config={"treespec": {
            "drafter": _drafter(kind, random_heads[kind], *dtype), "tree": BUILDERS[builder]}})
        out[run] = run_engine(tiny_model, {**ENGINE, **spec}, _phases(), inspect_proposer=True)
    return out


@pytest.mark.parametrize("run", RANDOM_RUNS, ids="-".join)
def test_head_greedy_equals_spec_off(runs, run):
    assert_same_outputs(runs["off"], runs[run])
    state = runs[run]["proposer"][0]
    assert state["stats"]["verified_trees"] > 0           # the head drafted and trees were verified
    assert state["drafter"]["cached_requests"] == 0       # caches freed when requests finished


# (fixture head, drafter.type or, when tree is None, the shipped preset served as is, tree) on code-lm
TRAINED = {"dart-chain": ("dart-head", "dart", {"builder": "chain"}),
           "dart-best_first": ("dart-head", "dart", {"builder": "best_first", "max_depth": 8}),
           "dart-preset": ("dart-head", "demo/dart", None),             # treespec_fixtures/demo/dart.yaml
           "jetspec-preset": ("jetspec-head", "demo/jetspec", None),    # treespec_fixtures/demo/jetspec.yaml
           "diffusion-preset": ("diffusion-head", "demo/diffusion-presto", None)}   # demo/diffusion-presto


@pytest.fixture(scope="module")
def trained_runs(code_lm_model):
    """The code-LM fixture served with its trained fixture heads (held-out code prompts), for
    the heads that are cached (conftest.trained_fixture: training them is not CI's job)."""
    from vllm_treespec.train.corpus import held_out_prompts

    wanted = {name: entry for name, entry in TRAINED.items() if trained_fixture_available(entry[0])}
    if not wanted:
        return {}
    prompts = held_out_prompts(8, 400, seed=3)
    phases = [{"name": "c8", "concurrency": 8, "prompts": prompts, "sampling": [greedy(48)] * len(prompts)}]
    engine = dict(ENGINE, max_model_len=1024)
    out = {"off": run_engine(code_lm_model, engine, phases)}
    for name, (fixture, kind, tree) in wanted.items():
        head = trained_fixture(fixture)
        treespec = kind if tree is None else {"drafter": {"type": kind, "path": str(head)}, "tree": tree}
        spec = dict(speculative_config=spec_config(8), additional_config={"treespec": treespec})
        out[name] = run_engine(code_lm_model, {**engine, **spec}, phases, inspect_proposer=True)
    return out


@pytest.mark.parametrize("builder", list(TRAINED))
def test_trained_head_is_accepted_when_served(trained_runs, builder):
    """Equal outputs, and the head trained on HF features is accepted on vLLM's aux features:
    a misaligned feature layer or position would leave it guessing (about 0 accepted)."""
    if builder not in trained_runs:
        trained_fixture(TRAINED[builder][0])        # skips, naming the command that builds it
    assert_same_outputs(trained_runs["off"], trained_runs[builder])
    stats = trained_runs[builder]["proposer"][0]["stats"]
    print(builder, stats["mean_accepted"], stats["verified_trees"])
    assert stats["mean_accepted"] > 1.0


# 20 blocks of 32 tokens for 8 requests of ~100 + 96 tokens: the scheduler must preempt; each
# prompt is sent twice, so the second copy hits vLLM's prefix cache (the head cache starts late)
TINY_KV = dict(dtype="float32", enforce_eager=True, max_model_len=512, max_num_seqs=8, seed=0,
               block_size=32, num_gpu_blocks_override=20, enable_prefix_caching=True)


@pytest.fixture(scope="module")
def preempt_runs(tiny_model, random_heads):
    from vllm_treespec.train import corpus

    prompts = corpus.held_out_prompts(4, prompt_chars=300, seed=11) * 2
    phases = [{"name": "preemption", "concurrency": 8, "prompts": prompts, "sampling": [greedy(96)] * 8}]
    out = {"off": run_engine(tiny_model, TINY_KV, phases)}
    for kind in ("dart", "jetspec"):
        spec = dict(speculative_config=spec_config(6), additional_config={"treespec": {
            "drafter": _drafter(kind, random_heads[kind]), "tree": BUILDERS["best_first"]}})
        out[kind] = run_engine(tiny_model, {**TINY_KV, **spec}, phases, inspect_proposer=True)
    return out


@pytest.mark.parametrize("kind", ["dart", "jetspec"])
def test_head_greedy_equal_under_preemption_and_prefix_caching(preempt_runs, kind):
    assert preempt_runs[kind]["metrics"].get("vllm:num_preemptions", 0) > 0, "KV cache did not force preemption"
    assert_same_outputs(preempt_runs["off"], preempt_runs[kind])
    assert preempt_runs[kind]["proposer"][0]["drafter"]["cached_requests"] == 0
