"""Tree verification end to end: greedy output with tree speculation on is bitwise equal to
speculation off, through a real vLLM engine (offline `LLM`, CPU, the code-LM fixture).

Every engine runs the same phases: 64 held-out prompts at concurrency 1, 8 and 32 with varied
max_tokens cuts, stop strings, prompts that run into max_model_len, long prompts that need
chunked prefill, repeated prompts served from the prefix cache, and a batch mixing requests that
trees cannot serve exactly (logprobs, penalties, min_tokens: they decode without drafts) with
plain ones. Trees of 1, 8, 16 and 64 nodes; prompt-lookup trees (several matches), n-gram
trie trees (best-first) and lookup-trie trees (both mixed; also cut by drafter.min_path_prob;
also over the self-distilled trie fixture; also with no corpus, learnt online from the
engine's own outputs).
A tiny KV cache forces preemption in a separate pair of engines. The token budget
(max_num_batched_tokens) is small enough that the scheduler cuts trees to a prefix of their
nodes at concurrency 32.
"""
from __future__ import annotations

import functools

import pytest

from e2e import assert_same_outputs, greedy, run_engine, spec_config
from vllm_treespec.train import corpus

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

MAX_LEN = 1024
ENGINE = dict(dtype="float32", enforce_eager=True, max_model_len=MAX_LEN, max_num_seqs=32, seed=0,
              block_size=32, enable_prefix_caching=True, enable_chunked_prefill=True,
              max_num_batched_tokens=256)
LOOKUP_TREE = {"drafter": {"type": "prompt_lookup", "max_matches": 8}, "tree": {"builder": "best_first"}}
NGRAM_TREE = {"drafter": {"type": "ngram_trie", "path": "fixture:stdlib-3gram", "k": 4},
              "tree": {"builder": "best_first", "topk": 4, "max_depth": 6}}
LOOKUP_TRIE_TREE = {"drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram"}, "tree": {"builder": "best_first", "max_depth": 8}}
TREES = {  # name -> (num_speculative_tokens = most nodes per tree, deployment config)
    "lookup-16": (16, LOOKUP_TREE),
    "lookup-64": (64, LOOKUP_TREE),
    "lookup-1": (1, LOOKUP_TREE),
    "ngram-8": (8, NGRAM_TREE),
    "lookup-trie-16": (16, LOOKUP_TRIE_TREE),
    # drafter.min_path_prob: trees cut where the drafter's own path probability gets low
    "lookup-trie-floor-16": (16, {**LOOKUP_TRIE_TREE,
                                  "drafter": {"type": "lookup_trie", "path": "fixture:stdlib-3gram", "min_path_prob": 0.03}}),
    # the self-distilled trie (the code-LM's own continuations): deep, confident trees
    "lookup-trie-distilled-16": (16, {**LOOKUP_TRIE_TREE,
                                      "drafter": {"type": "lookup_trie", "path": "fixture:code-lm-distill-5gram"}}),
    # no corpus: the trie learns only from this engine's finished outputs and searches them
    # verbatim (preset lookup-online)
    "lookup-online-16": (16, {"drafter": {"type": "lookup_trie", "path": None, "online_mb": 16,
                                          "recent_max_ngram": 16},
                              "tree": {"builder": "best_first", "max_depth": 8}}),
}
N = 64
PROMPTS = corpus.held_out_prompts(N, prompt_chars=400, seed=11)
LONG = corpus.held_out_prompts(4, prompt_chars=1600, seed=12)   # > 256 tokens: chunked prefill


def _spec(name: str) -> dict:
    k, cfg = TREES[name]
    return dict(speculative_config=spec_config(k), additional_config={"treespec": cfg})


def _near_max_len_prompts(tokenizer_dir) -> list[list[int]]:
    """Token-id prompts 20..60 tokens short of max_model_len (outputs hit the length cap)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    text = " ".join(corpus.held_out_prompts(12, prompt_chars=1200, seed=13))
    ids = tok(text)["input_ids"]
    return [ids[i * 7: i * 7 + MAX_LEN - 20 - 10 * i] for i in range(5)]


def _phases(model_dir) -> list[dict]:
    cuts = [8 + (i * 5) % 41 for i in range(N)]          # 8..48 tokens: varied max_tokens cuts
    mixed = [greedy(40, logprobs=2), greedy(40, presence_penalty=0.5), greedy(40, min_tokens=24),
             greedy(40, repetition_penalty=1.2), greedy(40)] * 4
    return [
        {"name": "c1", "concurrency": 1, "prompts": PROMPTS, "sampling": [greedy(n) for n in cuts]},
        {"name": "c8", "concurrency": 8, "prompts": PROMPTS, "sampling": [greedy(n + 16) for n in cuts]},
        {"name": "c32", "concurrency": 32, "prompts": PROMPTS, "sampling": [greedy(48)] * N},
        {"name": "stop-strings", "concurrency": 16, "prompts": PROMPTS[:16],
         "sampling": [greedy(80)] * 16, "stop_from_probe": [30, 36]},
        {"name": "near-max-len", "concurrency": 5, "prompts": _near_max_len_prompts(model_dir),
         "sampling": [greedy(64)] * 5},
        {"name": "long-prompts-chunked", "concurrency": 4, "prompts": LONG, "sampling": [greedy(48)] * 4},
        {"name": "prefix-cache-repeat", "concurrency": 8, "prompts": PROMPTS[:8] * 2,
         "sampling": [greedy(32)] * 16},
        {"name": "mixed-options", "concurrency": 20, "prompts": PROMPTS[:20], "sampling": mixed},
    ]


@pytest.fixture(scope="module")
def runs(code_lm_model, code_lm_distilled_trie):
    phases = _phases(code_lm_model)
    out = {"off": run_engine(code_lm_model, ENGINE, phases)}
    for name in TREES:
        out[name] = run_engine(code_lm_model, {**ENGINE, **_spec(name)}, phases, inspect_proposer=True)
    return out


@pytest.mark.parametrize("name", list(TREES))
def test_greedy_equal_with_trees(runs, name):
    assert_same_outputs(runs["off"], runs[name])


@pytest.mark.parametrize("name", list(TREES))
def test_trees_were_verified_and_accepted(runs, name):
    stats = runs[name]["proposer"][0]["stats"]
    k = TREES[name][0]
    assert stats["verified_trees"] > 100
    assert stats["accepted"] > 0
    assert stats["accepted"] <= stats["verified_nodes"]
    # every verified node was drafted by the proposer (scheduler cuts verify fewer): the requests
    # that run into max_model_len get their own capped drafts, not vLLM's zeros for the batch
    assert stats["verified_nodes"] <= stats["drafted_nodes"]
    hist = stats["nodes_hist"]
    assert len(hist) == k + 1 and sum(hist) == stats["verified_trees"]
    if k > 1:  # branching trees whose accepted path was not the node prefix moved KV
        assert stats["kv_moves"] > 0, "no accepted path left the node prefix: KV compaction untested"
        # the step-time breakdown saw every part (branching trees ran the tree attention)
        assert stats["attention_ms_per_step"] > 0 and stats["compaction_ms_per_step"] > 0
        assert 0 < stats["accept_ms_per_step"] <= stats["verify_ms_per_step"]
    assert stats["worker_step_ms"] > stats["draft_ms_per_step"] > 0


def test_the_online_only_trie_learnt_from_served_outputs(runs):
    """The online layer holds the engine's finished outputs (every phase after the first serves
    prompts answered before), so drafts from it were verified and the equality test covers them."""
    counters = runs["lookup-online-16"]["proposer"][0]["drafter"]
    assert counters["online_observed_tokens"] > 1000 and counters["online_used_slots"] > 100
    assert counters["recent_held_tokens"] > 1000


def test_cases_were_exercised(runs):
    phases = {p["name"]: p["outputs"] for p in runs["off"]["phases"]}
    assert sum(o["finish_reason"] == "length" for o in phases["c1"]) >= 32
    assert sum(o["finish_reason"] == "stop" and bool(o["stop"]) for o in phases["stop-strings"]) >= 4
    near = phases["near-max-len"]
    assert all(o["finish_reason"] == "length" for o in near)
    assert any(len(o["token_ids"]) < 64 for o in near), "no request ran into max_model_len"
    assert [o["num_logprobs"] for o in phases["mixed-options"][:5]] == [40, None, None, None, None]


def test_scheduler_cut_trees_and_fallbacks_ran(runs):
    """Node counts below the budget come from cuts (token budget, max_model_len) or small trees;
    at budget 64 with 32 requests and 256 batched tokens the scheduler must have cut."""
    hist = runs["lookup-64"]["proposer"][0]["stats"]["nodes_hist"]
    assert sum(hist[1:64]) > 0


def test_per_depth_acceptance_is_monotone(runs):
    for name in TREES:
        m = runs[name]["metrics"]
        per_pos = m["vllm:spec_decode_num_accepted_tokens_per_pos"]
        assert sum(per_pos) == m["vllm:spec_decode_num_accepted_tokens"]
        assert all(a >= b for a, b in zip(per_pos, per_pos[1:]))
        assert m["vllm:spec_decode_num_accepted_tokens"] <= m["vllm:spec_decode_num_draft_tokens"]


TINY_KV = dict(dtype="float32", enforce_eager=True, max_model_len=512, max_num_seqs=8, seed=0,
               block_size=32, num_gpu_blocks_override=24)


@pytest.fixture(scope="module")
def preempt_runs(code_lm_model):
    phases = [{"name": "preemption", "concurrency": 8, "prompts": PROMPTS[:8],
               "sampling": [greedy(128)] * 8}]
    return {"off": run_engine(code_lm_model, TINY_KV, phases),
            "on": run_engine(code_lm_model, {**TINY_KV, **_spec("lookup-16")}, phases,
                             inspect_proposer=True)}


def test_greedy_equal_under_preemption_with_trees(preempt_runs):
    assert preempt_runs["on"]["metrics"].get("vllm:num_preemptions", 0) > 0, "no preemption happened"
    assert preempt_runs["on"]["proposer"][0]["stats"]["verified_trees"] > 0
    assert_same_outputs(preempt_runs["off"], preempt_runs["on"])


TP_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}


@pytest.fixture(scope="module")
def tp_runs(tiny_model):
    """Tensor parallelism 2 on CPU (one OpenMP thread per rank): each rank drafts and verifies the
    same trees; the output rank's drafts reach the scheduler. The tiny fixture (2 KV heads; the
    code-LM has one, which TP=2 cannot split)."""
    engine = {**ENGINE, "tensor_parallel_size": 2}
    phases = [{"name": "tp-c8", "concurrency": 8, "prompts": PROMPTS[:16], "sampling": [greedy(48)] * 16}]
    # auto budgets: each rank times its own steps; rank 0's choice must rule every rank
    auto = _spec("lookup-16")
    auto["additional_config"] = {"treespec": {**auto["additional_config"]["treespec"], "budget": {
        "mode": "auto", "auto": {"margin": 0.0, "patience": 1, "explore_every": 2}}}}
    # spawned engine core and workers, as under `vllm serve`
    run = functools.partial(run_engine, tiny_model, phases=phases, env=TP_ENV, multiprocess=True)
    return {"off": run(engine),
            "on": run({**engine, **_spec("lookup-16")}, inspect_proposer=True),
            "auto": run({**engine, **auto}, inspect_proposer=True)}


def test_greedy_equal_with_trees_under_tensor_parallelism(tp_runs):
    ranks = tp_runs["on"]["proposer"]
    assert len(ranks) == 2
    # identical drafting and verification on both ranks
    assert ranks[0]["stats"]["verified_nodes"] == ranks[1]["stats"]["verified_nodes"] > 0
    assert ranks[0]["stats"]["depth_hist"] == ranks[1]["stats"]["depth_hist"]
    assert ranks[0]["stats"]["kv_moves"] == ranks[1]["stats"]["kv_moves"]
    assert_same_outputs(tp_runs["off"], tp_runs["on"])


def test_auto_budget_choices_agree_across_ranks(tp_runs):
    ranks = tp_runs["auto"]["proposer"]
    assert len(ranks) == 2
    assert ranks[0]["stats"]["budget_choices"] == ranks[1]["stats"]["budget_choices"]
    assert sum(ranks[0]["stats"]["budget_choices"].values()) > 0
    assert ranks[0]["stats"]["verified_nodes"] == ranks[1]["stats"]["verified_nodes"]
    assert_same_outputs(tp_runs["off"], tp_runs["auto"])
