"""Building tries: every input kind, the reference counts, identical bytes across workers and spills."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

from harness.dict_trie import DictTrie
from vllm_treespec.train import corpus
from vllm_treespec.ngram import NgramTrie, build_trie, build_trie_from_streams, tokenizer_fingerprint
from vllm_treespec.ngram.tokenizer import encode_batch, load_tokenizer


@pytest.fixture(scope="module")
def code_files() -> list[Path]:
    """About 150 KB of stdlib training files (a few hundred thousand bytes of real code)."""
    train, _ = corpus.split_files()
    files, size = [], 0
    for p in train[40:]:
        if size > 150_000:
            break
        files.append(p)
        size += p.stat().st_size
    return files


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_every_input_kind_counts_like_the_reference(tmp_path, tiny_model):
    tok = load_tokenizer(tiny_model)
    texts = ["def f(x):\n    return x + 1\n", "for i in range(10):\n    print(i)\n", "x = [1, 2, 3]\n"]
    (tmp_path / "a.py").write_text(texts[0])
    (tmp_path / "b.txt").write_text(texts[1])
    (tmp_path / "c.jsonl").write_text("\n".join(json.dumps({"text": t, "id": i}) for i, t in enumerate(texts)) + "\n")
    ids = [np.array(x, dtype=np.int64) for x in encode_batch(tok, texts)]
    np.save(tmp_path / "d.npy", ids[0])
    ids[1].astype("<i4").tofile(tmp_path / "e.i32")
    ids[2].astype("<u2").tofile(tmp_path / "f.u16")
    report = build_trie([tmp_path], tmp_path / "out" / "t.trie", tiny_model, order=4)
    assert report["files"] == 6
    streams = encode_batch(tok, texts[:2]) + encode_batch(tok, texts) + [list(map(int, x)) for x in ids]
    ref = DictTrie.build(streams, 4)
    trie = NgramTrie.load(tmp_path / "out" / "t.trie", expected_fingerprint=tokenizer_fingerprint(tiny_model),
                          verify=True)
    assert trie.num_nodes == ref.num_nodes() == report["num_nodes"]
    assert trie.vocab_size == 1024 and trie.tokenizer_name.startswith("tiny-")
    assert report["tokens"] == sum(len(s) for s in streams)
    cands = np.arange(1024, dtype=np.int32)
    for s in streams:
        for end in range(0, len(s) + 1, 3):
            ctx = s[:end]
            assert trie.prob(ctx, cands).tolist() == [ref.prob(ctx, int(c)) for c in cands]
            assert trie.topk(ctx, 5) == ref.topk(ctx, 5)


def test_build_is_deterministic_across_workers_and_spills(tmp_path, tiny_model, code_files):
    """Same input, same bytes: one worker, two workers, and spilling with multi-pass merges."""
    digests = {}
    reports = {}
    for name, kw in {"w1": dict(workers=1), "w2": dict(workers=2),
                     "w1-spill": dict(workers=1, memory_mb=0.05), "w2-spill": dict(workers=2, memory_mb=0.05)}.items():
        out = tmp_path / f"{name}.trie"
        reports[name] = build_trie(code_files, out, tiny_model, order=3, **kw)
        digests[name] = sha(out)
    assert len(set(digests.values())) == 1, digests
    assert reports["w1"]["spill_runs"] == 1
    assert reports["w1-spill"]["spill_runs"] > 10 and reports["w1-spill"]["intermediate_merges"] > 0
    assert reports["w2"]["workers"] == 2
    again = tmp_path / "again.trie"
    build_trie(code_files, again, tiny_model, order=3)
    assert sha(again) == digests["w1"]
    assert not list(tmp_path.glob(".ngram-build-*")), "scratch files left behind"


def test_pruning_and_higher_orders_match_reference(tmp_path):
    rng = np.random.default_rng(3)
    streams = [rng.integers(0, 12, size=int(rng.integers(0, 300))) for _ in range(12)]
    for order, min_count in [(5, 1), (5, 3), (2, 2), (8, 2)]:
        out = tmp_path / f"o{order}m{min_count}.trie"
        report = build_trie_from_streams(streams, out, order=order, min_count=min_count, memory_mb=0.02)
        ref = DictTrie.build([s.tolist() for s in streams], order, min_count=min_count)
        trie = NgramTrie.load(out, verify=True)
        assert trie.num_nodes == ref.num_nodes() == report["num_nodes"]
        for _ in range(30):
            ctx = rng.integers(-1, 13, size=int(rng.integers(0, 9))).tolist()
            assert trie.prob(ctx, range(13)).tolist() == [ref.prob(ctx, c) for c in range(13)]
            assert trie.topk(ctx, 4) == ref.topk(ctx, 4)


def _build_in_child(ids: str, out: str) -> None:
    build_trie([ids], out, workers=2)


def test_build_inside_a_daemon_process_counts_in_process(tmp_path):
    """vLLM workers are daemonic (no children allowed): a fixture build there must still work."""
    import multiprocessing as mp

    np.save(tmp_path / "ids.npy", np.arange(100, dtype=np.int32) % 9)
    np.save(tmp_path / "more.npy", np.arange(50, dtype=np.int32) % 5)
    p = mp.get_context("spawn").Process(target=_build_in_child, args=(str(tmp_path), str(tmp_path / "d.trie")),
                                        daemon=True)
    p.start()
    p.join(timeout=120)
    assert p.exitcode == 0
    assert NgramTrie.load(tmp_path / "d.trie", verify=True).num_nodes > 1


def test_empty_corpus_gives_a_valid_root_only_trie(tmp_path):
    build_trie_from_streams([[], []], tmp_path / "e.trie", order=3)
    trie = NgramTrie.load(tmp_path / "e.trie", verify=True)
    assert trie.num_nodes == 1
    assert trie.prob([1, 2], [0, 1], floor=0.25).tolist() == [0.25, 0.25]
    assert trie.topk([0], 3) == []


def test_build_errors_are_clear(tmp_path, tiny_model):
    (tmp_path / "a.txt").write_text("hello")
    with pytest.raises(ValueError, match="--tokenizer"):
        build_trie([tmp_path / "a.txt"], tmp_path / "t.trie")
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        build_trie([tmp_path / "missing.txt"], tmp_path / "t.trie", tiny_model)
    with pytest.raises(ValueError, match="--order"):
        build_trie([tmp_path / "a.txt"], tmp_path / "t.trie", tiny_model, order=9)
    np.save(tmp_path / "big.npy", np.array([5, 2000], dtype=np.int32))
    with pytest.raises(ValueError, match="vocabulary size 1024"):
        build_trie([tmp_path / "big.npy"], tmp_path / "t.trie", tiny_model)
    (tmp_path / "bad.jsonl").write_text('{"text": "ok"}\n{"body": "no text"}\n')
    with pytest.raises(ValueError, match="bad.jsonl:2"):
        build_trie([tmp_path / "bad.jsonl"], tmp_path / "t.trie", tiny_model)
    with pytest.raises(ValueError, match=">= 0"):
        build_trie_from_streams([[1, -2]], tmp_path / "t.trie")
    assert not (tmp_path / "t.trie").exists()
