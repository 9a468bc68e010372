"""`make demo`: serve the code-LM fixture with speculation off, then with treespec's best
1-client preset (`lookup-trie-distilled`: lookup-trie chains over the fixture's self-distilled
trie), on the same held-out code prompts through the OpenAI endpoint, and print the speedup.

It is the one-command proof that the plugin is lossless (greedy outputs identical to no
speculation; the exit code is non-zero otherwise) and what it buys on this machine.

    .venv/bin/python benchmarks/demo.py [--quick]       # what `make demo` runs
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from harness.comparison import all_match, no_spec, run_comparison, summarize, treespec
from harness.report import fmt_float, fmt_match, fmt_ratio, format_table, hardware_line
from harness.serving import ServerError

DEMO_PRESET = "demo/lookup-trie-distilled"
DEMO_K = 32
FULL = {"prompts": 16, "max_tokens": 128}
# The quick run keeps the full length: greedy continuations of this fixture grow more repetitive
# as they go, so drafts pay most after the first few dozen tokens (4 prompts x 32 tokens measured
# 0.90x no speculation, tau 2.56; 4 x 128 measured 1.73x, tau 5.08, on the 2-core dev VM).
QUICK = {"prompts": 4, "max_tokens": 128}
PROMPT_CHARS = 600

COLUMNS = [("config", "config", str), ("tokens/s", "tokens_per_s", fmt_float(1)),
           ("tau", "tau", fmt_float(2)), ("tok/step", "tokens_per_step", fmt_float(2)),
           ("exact match", "exact_match", fmt_match), ("speedup", "speedup_vs_off", fmt_ratio)]


def _pick_fixture() -> tuple[str, Path]:
    from treespec_fixtures import FIXTURES, build_fixture

    if "code-lm" in FIXTURES:
        print("fixture: code-lm (the first build trains it for a few minutes; cached afterwards)", flush=True)
        return "code-lm", build_fixture("code-lm")
    print("fixture: code-lm is not registered in this checkout yet; falling back to `tiny` "
          "(a random model: outputs are noise, so tau and speedup mean nothing)", flush=True)
    return "tiny", build_fixture("tiny")


def _fixture_summary(model_dir: Path) -> str:
    try:
        meta = json.loads((model_dir / "fixture.json").read_text())
    except (OSError, ValueError):
        return model_dir.name
    params = meta.get("params")
    return f"{model_dir.name} ({meta.get('kind', '?')}" + (f", {params / 1e6:.1f}M params)" if params else ")")


def run_demo(quick: bool = False) -> int:
    """Run the demo; 0 when every greedy output matched speculation off, 1 if not, 2 on failure."""
    from vllm_treespec.train.corpus import held_out_prompts

    size = QUICK if quick else FULL
    print(hardware_line(), flush=True)
    name, model_dir = _pick_fixture()
    print(f"model: {_fixture_summary(model_dir)}", flush=True)
    preset = DEMO_PRESET if name == "code-lm" else "prompt-lookup"   # the distilled trie is code-lm's
    prompts = held_out_prompts(size["prompts"], PROMPT_CHARS, seed=0)
    warmup = held_out_prompts(2, PROMPT_CHARS, seed=1)
    print(f"{len(prompts)} held-out code prompts, max_tokens {size['max_tokens']}, greedy, "
          f"concurrency 1; treespec {preset} K={DEMO_K}", flush=True)
    if preset == DEMO_PRESET:
        from treespec_fixtures.tries import build_trie_fixture

        print("trie: code-lm-distill-5gram (the first build generates with the model for ~2 minutes; "
              "cached afterwards)", flush=True)
        build_trie_fixture("code-lm-distill-5gram", model_dir)
    try:
        measurements = run_comparison(str(model_dir), [no_spec(), treespec(DEMO_K, preset)], prompts,
                                      max_tokens=size["max_tokens"], concurrencies=(1,),
                                      warmup_prompts=warmup)
    except ServerError as e:
        print(f"demo failed: {e}", file=sys.stderr)
        return 2
    rows = summarize(measurements, baseline="off")
    print()
    print(format_table(rows, COLUMNS))
    print("\ntau = tokens per verification step with a draft (1 + accepted/drafts); "
          "tok/step counts every step, drafted or not.")
    if not all_match(rows):
        print("FAIL: greedy outputs differ from speculation off", file=sys.stderr)
        return 1
    print(f"OK: greedy outputs identical to speculation off ({name} fixture)")
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="serve the code-LM fixture with speculation off and on; "
                                            "print the speedup")
    p.add_argument("--quick", action="store_true", help="fewer prompts (a smoke run)")
    return run_demo(quick=p.parse_args(argv).quick)


if __name__ == "__main__":
    sys.exit(main())
