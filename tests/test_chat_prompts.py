"""Chat prompts from MT-Bench and HumanEval (benchmarks/chat_prompts.py) and the harness's chat
requests (benchmarks/harness/serving.py)."""
from __future__ import annotations

import pytest

import chat_prompts
from chat_prompts import ChatPrompt, prompt_sets
from harness.serving import chat_messages


def _pool(n: int) -> list[ChatPrompt]:
    return [ChatPrompt(f"x/{i}", "mt_bench", f"q{i}") for i in range(n)]


def test_prompt_sets_take_consecutive_windows_and_count_repeats():
    sets, repeats = prompt_sets(_pool(5), [2, 2])
    assert [[p.id for p in s] for s in sets] == [["x/0", "x/1"], ["x/2", "x/3"]] and repeats == 0
    sets, repeats = prompt_sets(_pool(5), [3, 4])
    assert [p.id for p in sets[1]] == ["x/3", "x/4", "x/0", "x/1"] and repeats == 2
    with pytest.raises(ValueError):
        prompt_sets([], [1])


def test_pool_interleaves_sources_and_holds_every_prompt():
    pool = chat_prompts.chat_pool(seed=0)
    assert len(pool) == 80 + 164 and len({p.id for p in pool}) == len(pool)
    assert [p.source for p in pool[:6]] == ["mt_bench", "humaneval"] * 3
    assert chat_prompts.chat_pool(seed=0) == pool and chat_prompts.chat_pool(seed=1) != pool
    he = next(p for p in pool if p.source == "humaneval")
    assert "```python\n" in he.content and he.content.startswith(chat_prompts.HUMANEVAL_INSTRUCTION)
    with pytest.raises(ValueError, match="unknown prompt source"):
        chat_prompts.chat_pool(sources=["sharegpt"])


def test_chat_messages_of_each_prompt_kind():
    assert chat_messages("plain text") is None
    cp = ChatPrompt("x/0", "mt_bench", "hello")
    assert chat_messages(cp) == [{"role": "user", "content": "hello"}]
    assert chat_messages([{"role": "user", "content": "hi"}]) == [{"role": "user", "content": "hi"}]


def test_seen_before_counts_each_sets_prompts_held_by_an_earlier_set():
    sets, _ = prompt_sets(_pool(5), [3, 4, 2])
    assert chat_prompts.seen_before(sets) == [0, 2, 2]
    assert chat_prompts.seen_before(prompt_sets(_pool(9), [3, 3, 3])[0]) == [0, 0, 0]
