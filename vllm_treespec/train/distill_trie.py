"""Self-distilled n-gram tries: a drafter trie counted from the served model's own continuations.

Why: a trie counted from a text corpus predicts the corpus, while verification accepts what the
target model would write. A model's continuations follow its own habits (idioms, repeated
structures, the way greedy decoding settles into patterns) more closely than any corpus does.
Counting the target's continuations of in-domain prompts gives the drafter those habits. On the
code-LM fixture the lookup-trie chain verifies 7.10 instead of 5.14 tokens per step with such a
trie (budget 32) in the greedy replay of the held-out prompts
(benchmarks/results/replay_tau_distilled_code-lm.json), and served it runs at 1.6x vLLM's
`ngram` (benchmarks/results/bench_paired_ngram12_vs_lookup_trie_distilled_code-lm.json).

Each prompt contributes its last `context` tokens followed by its continuation. The tail lets
the first n-grams of the continuation carry their real context, and it keeps the counts about
the model's writing rather than the prompts' text, which the corpus trie already covers. Use prompts
like the traffic the deployment serves, never the prompts a benchmark measures. Greedy
continuations (temperature 0) match greedy traffic; for sampled traffic generate at the served
temperature, several samples per prompt.

    vllm-treespec train trie MODEL --out model.trie --prompts prompts.jsonl --order 5
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable, Sequence

__all__ = ["distill_streams", "read_prompts", "build_distilled_trie"]


def distill_streams(pairs: Iterable[tuple[Sequence[int], Sequence[int]]], context: int
                    ) -> list[list[int]]:
    """The token streams a distilled trie counts: per (prompt, continuation) pair, the prompt's
    last `context` tokens followed by the continuation (empty continuations are skipped)."""
    if context < 0:
        raise ValueError(f"context must be >= 0, got {context}")
    streams = []
    for prompt, cont in pairs:
        if len(cont) == 0:
            continue
        tail = list(prompt[len(prompt) - context:]) if context else []
        streams.append(tail + list(cont))
    return streams


def read_prompts(path: str | Path) -> list[str]:
    """Prompts from a JSONL file: one JSON string or {"prompt": "..."} object per line."""
    prompts = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}:{number}: not JSON ({e.msg}); write one JSON string or "
                                 '{"prompt": "..."} object per line') from None
            if isinstance(item, dict):
                item = item.get("prompt")
            if not isinstance(item, str) or not item:
                raise ValueError(f"{path}:{number}: expected a non-empty JSON string or an object with a "
                                 'non-empty "prompt" string')
            prompts.append(item)
    if not prompts:
        raise ValueError(f"{path}: no prompts; write one JSON string or {{\"prompt\": ...}} per line")
    return prompts


def build_distilled_trie(model_dir: str | Path, prompts: Sequence[str], out: str | Path, *,
                         max_tokens: int = 128, temperature: float = 0.0, seed: int = 0,
                         order: int = 5, min_count: int = 1, context: int = 4,
                         engine: dict[str, Any] | None = None,
                         samples_per_prompt: int = 1) -> dict[str, Any]:
    """Generate the target's continuations of `prompts` through vLLM and count them into the trie
    file `out` (stamped with the model's tokenizer). Several samples per prompt (temperature > 0)
    make the counts follow the model's sampling distribution, not one draw of it. Returns the
    build report."""
    from transformers import AutoConfig

    from vllm_treespec.ngram.build import build_trie_from_streams
    from vllm_treespec.ngram.fingerprint import tokenizer_fingerprint
    from vllm_treespec.ngram.tokenizer import load_tokenizer, tokenizer_name, vocab_size
    from vllm_treespec.train.data import continuations

    if not prompts:
        raise ValueError("no prompts to generate from")
    tokenizer = load_tokenizer(model_dir)
    vocab = max(vocab_size(tokenizer), int(AutoConfig.from_pretrained(str(model_dir)).vocab_size))
    pairs = continuations(model_dir, prompts, max_tokens=max_tokens, temperature=temperature, seed=seed,
                          engine=engine, samples=samples_per_prompt)
    streams = distill_streams(pairs, context)
    if not streams:
        raise ValueError("the model generated no tokens for any prompt; raise max_tokens or check "
                         "that the prompts do not end generation at once")
    report = build_trie_from_streams(streams, out, fingerprint=tokenizer_fingerprint(tokenizer),
                                     tokenizer_name=tokenizer_name(model_dir), order=order,
                                     min_count=min_count, vocab_size=vocab)
    report.update(prompts=len(prompts), generated_tokens=sum(len(c) for _, c in pairs),
                  max_tokens=max_tokens, temperature=temperature, seed=seed, context=context,
                  samples_per_prompt=samples_per_prompt)
    return report
