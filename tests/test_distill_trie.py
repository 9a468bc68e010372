"""Self-distilled tries (train/distill_trie.py, `vllm-treespec train trie`): what is counted, the
prompt file format, the trie's header, the CLI through a real vLLM engine, and the fixture's
tokenizer check."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from vllm_treespec.ngram import NgramTrie, tokenizer_fingerprint
from vllm_treespec.ngram.build import build_trie_from_streams
from vllm_treespec.train.distill_trie import build_distilled_trie, distill_streams, read_prompts


def test_streams_are_prompt_tail_then_continuation():
    pairs = [([1, 2, 3, 4, 5], [6, 7]), ([9], [10, 11, 12]), ([1, 2], [])]
    assert distill_streams(pairs, 2) == [[4, 5, 6, 7], [9, 10, 11, 12]]   # empty continuation skipped
    assert distill_streams(pairs, 0) == [[6, 7], [10, 11, 12]]
    with pytest.raises(ValueError, match="context"):
        distill_streams(pairs, -1)


def test_read_prompts_accepts_strings_and_objects(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text('"def f(x):"\n\n{"prompt": "class A:", "id": 3}\n')
    assert read_prompts(path) == ["def f(x):", "class A:"]


@pytest.mark.parametrize("line, message", [("def f(x):", "not JSON"), ('{"text": "x"}', '"prompt"'),
                                           ('""', "non-empty")])
def test_read_prompts_names_the_bad_line(tmp_path, line, message):
    path = tmp_path / "p.jsonl"
    path.write_text('"ok"\n' + line + "\n")
    with pytest.raises(ValueError, match=message) as e:
        read_prompts(path)
    assert f"{path}:2" in str(e.value)


def test_trie_counts_exactly_the_distilled_streams(tmp_path, tiny_model, monkeypatch):
    """The pipeline around generation: the trie equals one built from distill_streams(pairs),
    stamped with the model's tokenizer (generation itself is vLLM's, tested below)."""
    rng = np.random.default_rng(0)
    pairs = [(rng.integers(0, 50, 7).tolist(), rng.integers(0, 50, 20).tolist()) for _ in range(6)]

    def fake_continuations(model_dir, prompts, **kw):
        assert kw["max_tokens"] == 20 and kw["temperature"] == 0.0
        return pairs[:len(prompts)]

    monkeypatch.setattr("vllm_treespec.train.data.continuations", fake_continuations)
    report = build_distilled_trie(tiny_model, ["p"] * 6, tmp_path / "d.trie", max_tokens=20, order=3,
                                  context=2)
    assert report["generated_tokens"] == 120 and report["total_tokens"] == 120 + 6 * 2
    trie = NgramTrie.load(tmp_path / "d.trie", expected_fingerprint=tokenizer_fingerprint(tiny_model),
                          verify=True)
    build_trie_from_streams(distill_streams(pairs, 2), tmp_path / "ref.trie", order=3, min_count=1,
                            vocab_size=trie.vocab_size)
    ref = NgramTrie.load(tmp_path / "ref.trie")
    assert trie.order == 3
    for prompt, cont in pairs:
        seq = prompt[-2:] + cont
        for i in range(len(seq) - 1):
            ctx = seq[max(0, i - 1):i + 1]
            assert trie.topk(ctx, 8) == ref.topk(ctx, 8)


def test_no_prompts_is_an_error(tmp_path, tiny_model):
    with pytest.raises(ValueError, match="no prompts"):
        build_distilled_trie(tiny_model, [], tmp_path / "d.trie")


@pytest.mark.slow
def test_cli_builds_a_trie_from_the_models_continuations(tmp_path, tiny_model):
    """Sampled, two continuations per prompt (the sampled-trie recipe; the greedy one builds the
    code-LM fixture trie in conftest)."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("\n".join(json.dumps(p) for p in ["def f(x):", "import os", "class A:", "x = 1"]))
    out, report_path = tmp_path / "tiny.trie", tmp_path / "report.json"
    subprocess.run([sys.executable, "-m", "vllm_treespec.cli", "train", "trie", str(tiny_model), "--out",
                    str(out), "--prompts", str(prompts), "--max-tokens", "12", "--order", "3",
                    "--context", "2", "--report", str(report_path), "--max-model-len", "256",
                    "--temperature", "0.8", "--samples-per-prompt", "2"],
                   check=True, capture_output=True, text=True)
    report = json.loads(report_path.read_text())
    assert report["prompts"] == 4 and report["samples_per_prompt"] == 2
    assert 0 < report["generated_tokens"] <= 2 * 4 * 12
    context_tokens = report["total_tokens"] - report["generated_tokens"]   # 2 per counted stream
    assert context_tokens % 2 == 0 and 4 < context_tokens // 2 <= 8, "samples were not counted"
    trie = NgramTrie.load(out, expected_fingerprint=tokenizer_fingerprint(tiny_model), verify=True)
    assert trie.order == 3 and trie.num_nodes > 1


def test_cli_rejects_bad_flags_before_loading_anything(tmp_path, capsys):
    from vllm_treespec.cli import main

    assert main(["train", "trie", "fixture:tiny", "--out", str(tmp_path / "x.trie"), "--order", "0"]) == 2
    assert "--order must be >= 1" in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    assert main(["train", "trie", "fixture:tiny", "--out", str(tmp_path / "x.trie"), "--prompts", str(bad)]) == 2
    assert f"{bad}:1" in capsys.readouterr().err
    assert main(["train", "trie", "fixture:tiny", "--out", str(tmp_path / "x.trie"),
                 "--samples-per-prompt", "2"]) == 2
    assert "--samples-per-prompt 2 needs --temperature > 0" in capsys.readouterr().err
    assert not (tmp_path / "x.trie").exists()


def test_distilled_fixture_refuses_another_tokenizer(tiny_model, code_lm_model):
    from treespec_fixtures.tries import build_trie_fixture

    with pytest.raises(ValueError, match="code-lm-distill-5gram.*train trie"):
        build_trie_fixture("code-lm-distill-5gram", tiny_model)

