"""Trie fixtures, built on first use and cached.

`fixture:stdlib-3gram` / `fixture:stdlib-5gram` in a config or on the command line resolve to a
cached trie file built from `vllm_treespec.train.corpus.split_files()[0]` (held-out files stay
unseen, like the fixture models) with the given tokenizer; the cache key includes the
tokenizer's fingerprint, so the code-LM and tiny tokenizers each get their own trie.

`fixture:code-lm-distill-5gram` is a self-distilled trie (vllm_treespec/train/distill_trie.py):
the code-LM fixture's own greedy continuations of 2048 training-split prompts, counted to order
5. It is built by `vllm-treespec train trie` in a subprocess (the caller never imports vLLM),
about two minutes on the 2-core dev VM, and serves only models with the code-LM's tokenizer.
`fixture:code-lm-distill-5gram-t07` counts four sampled continuations (temperature 0.7) of the
same prompts instead: the trie for sampled requests (`drafter.sampled_path`).
"""
from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any

from treespec_fixtures.cache import cached_build
from vllm_treespec.native import native
from vllm_treespec.train import corpus

PREFIX = "fixture:"
TRIE_FILE = "ngram.trie"
TRIE_FIXTURES: dict[str, dict[str, Any]] = {
    "stdlib-3gram": {"order": 3, "min_count": 1},
    "stdlib-5gram": {"order": 5, "min_count": 2},
}
# the recipe's name for the prompts of a self-distilled trie, kept from when the corpus lived in
# vllm_treespec.fixtures: it is part of the cache key, and a new key rebuilds the tries (minutes each)
DISTILLED_PROMPTS_SOURCE = "vllm_treespec.fixtures.corpus.training_prompts"
# self-distilled tries: `vllm-treespec train trie` flags per fixture (the model is a fixture name)
# dtype float32: the code-LM is served in float32 wherever its outputs are compared, and vLLM's
# `auto` runs a float32 checkpoint in bf16 on CPU, which an AVX2-only CPU emulates (several
# times slower than float32 there).
DISTILLED_TRIE_FIXTURES: dict[str, dict[str, Any]] = {
    "code-lm-distill-5gram": {"model": "code-lm", "order": 5, "min_count": 1, "context": 4,
                              "num_prompts": 2048, "prompt_chars": 600, "max_tokens": 128,
                              "temperature": 0.0, "seed": 0, "dtype": "float32"},
    "code-lm-distill-5gram-t07": {"model": "code-lm", "order": 5, "min_count": 1, "context": 4,
                                  "num_prompts": 2048, "prompt_chars": 600, "max_tokens": 128,
                                  "temperature": 0.7, "samples_per_prompt": 4, "seed": 0,
                                  "dtype": "float32"},
}


def trie_fixture_names() -> list[str]:
    return sorted([*TRIE_FIXTURES, *DISTILLED_TRIE_FIXTURES])


def build_trie_fixture(name: str, tokenizer_dir: str | Path, *, workers: int | None = None,
                       progress: bool = False) -> Path:
    """Build (or reuse) trie fixture `name` for the tokenizer in `tokenizer_dir`; returns the trie file."""
    from vllm_treespec.ngram.build import build_trie
    from vllm_treespec.ngram.fingerprint import tokenizer_fingerprint

    if name in DISTILLED_TRIE_FIXTURES:
        return _build_distilled_fixture(name, tokenizer_dir)
    if name not in TRIE_FIXTURES:
        raise ValueError(f"unknown trie fixture {name!r}; choose one of {trie_fixture_names()}")
    spec = TRIE_FIXTURES[name]
    train, _ = corpus.split_files()
    recipe = {"version": 2, "name": name, **spec, "corpus": "stdlib-train",
              "held_out_percent": corpus.HELD_OUT_PERCENT, "python": platform.python_version(),
              "train_files": len(train), "tokenizer_fingerprint": tokenizer_fingerprint(tokenizer_dir),
              "format_version": native().ngram.FORMAT_VERSION}

    def build(out_dir: Path) -> None:
        report = build_trie(train, out_dir / TRIE_FILE, tokenizer_dir, order=spec["order"],
                            min_count=spec["min_count"], workers=workers or min(2, os.cpu_count() or 1),
                            progress=progress)
        report.pop("out", None)
        (out_dir / "fixture.json").write_text(json.dumps({"build": report}, indent=2))

    return cached_build(f"ngram-{name}", recipe, build) / TRIE_FILE


def _build_distilled_fixture(name: str, tokenizer_dir: str | Path) -> Path:
    """A self-distilled trie fixture: its model's continuations counted by `vllm-treespec train
    trie` (in a subprocess: vLLM runs there, with its own engine and workers)."""
    import subprocess
    import sys

    from treespec_fixtures.registry import build_fixture
    from vllm_treespec.ngram.fingerprint import tokenizer_fingerprint

    spec = dict(DISTILLED_TRIE_FIXTURES[name])
    model_dir = build_fixture(spec.pop("model"))
    fingerprint = tokenizer_fingerprint(model_dir)
    if tokenizer_fingerprint(tokenizer_dir) != fingerprint:
        raise ValueError(f"trie fixture {name!r} is counted from {model_dir.name}'s continuations with "
                         f"its tokenizer, which differs from the tokenizer of {tokenizer_dir}; use it "
                         f"with that model, or build your model's own trie with `vllm-treespec train "
                         "trie MODEL --out FILE`")
    recipe = {"version": 1, "name": name, "model": model_dir.name, **spec,
              "prompts": DISTILLED_PROMPTS_SOURCE,
              "held_out_percent": corpus.HELD_OUT_PERCENT, "python": platform.python_version(),
              "tokenizer_fingerprint": fingerprint, "format_version": native().ngram.FORMAT_VERSION}

    def build(out_dir: Path) -> None:
        flags = [f"--{k.replace('_', '-')}={v}" for k, v in spec.items()]
        report_path = out_dir / "build.json"
        subprocess.run([sys.executable, "-m", "vllm_treespec.cli", "train", "trie", str(model_dir),
                        "--out", str(out_dir / TRIE_FILE), "--report", str(report_path), *flags], check=True)
        report = json.loads(report_path.read_text())
        report_path.unlink()
        (out_dir / "fixture.json").write_text(json.dumps({"build": report}, indent=2))

    return cached_build(f"ngram-{name}", recipe, build) / TRIE_FILE

