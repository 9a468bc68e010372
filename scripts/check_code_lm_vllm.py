"""Check that vLLM serves the code-lm / draft-lm fixtures as-is: load, greedy-generate held-out prompts.

Usage: python scripts/check_code_lm_vllm.py [code-lm|draft-lm ...] [--prompts N] [--max-tokens N]
Prints each prompt's tail and the greedy continuation. The `__main__` guard is required because
vLLM spawns worker processes.
"""
from __future__ import annotations

import argparse
import os


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("fixtures", nargs="*", default=["code-lm"])
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    ns = parser.parse_args()
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from vllm import LLM, SamplingParams

    from treespec_fixtures import build_fixture
    from vllm_treespec.train.corpus import held_out_prompts

    prompts = held_out_prompts(ns.prompts, prompt_chars=400)
    params = SamplingParams(temperature=0.0, max_tokens=ns.max_tokens)
    for name in ns.fixtures:
        llm = LLM(model=str(build_fixture(name)), dtype="float32", enforce_eager=True, max_model_len=1024)
        for prompt, out in zip(prompts, llm.generate(prompts, params)):
            comp = out.outputs[0]
            print(f"===== {name}: prompt tail =====\n{prompt[-200:]}")
            print(f"===== {name}: greedy continuation ({len(comp.token_ids)} tokens) =====\n{comp.text}\n")
        del llm


if __name__ == "__main__":
    main()
