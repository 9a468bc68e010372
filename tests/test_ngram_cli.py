"""`vllm-treespec ngram build/info/query` on a small corpus with the tiny fixture tokenizer."""
from __future__ import annotations

import json

import numpy as np
import pytest

from vllm_treespec.cli import main


@pytest.fixture()
def small_corpus(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    for i in range(5):
        (src / f"m{i}.py").write_text("".join(f"def f{j}(x):\n    return x + {j}\n\n" for j in range(30 + i)))
    (src / "notes.jsonl").write_text(json.dumps({"text": "for i in range(10):\n    print(i)\n"}) + "\n")
    (src / "ignored.bin.txt~").write_text("not matched by the default globs")
    return src


def test_build_info_query(tmp_path, tiny_model, small_corpus, capsys):
    out = tmp_path / "code.trie"
    assert main(["ngram", "build", "--tokenizer", str(tiny_model), "--order", "4", "--out", str(out),
                 "--min-count", "1", "--workers", "2", "--memory-mb", "16", "--quiet", str(small_corpus)]) == 0
    built = capsys.readouterr().out
    assert f"built {out}" in built and "from 6 files" in built and "B/node" in built

    assert main(["ngram", "info", str(out), "--verify"]) == 0
    info = capsys.readouterr().out
    assert "version 1, order 4, vocab 1,024" in info and "verify        ok" in info and "bytes/node" in info

    assert main(["ngram", "info", str(out), "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["order"] == 4 and stats["tokenizer"].startswith("tiny-") and stats["verify"] is None

    assert main(["ngram", "query", str(out), "--tokenizer", str(tiny_model), "    return x", "--k", "3"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("context (3 of")
    rows = lines[2:]
    assert len(rows) == 3 and rows[0].split()[0] == "1"
    assert "' +'" in rows[0] or "' + '" in rows[0] or "'+'" in rows[0]  # "return x" is followed by " +"
    probs = [float(r.split()[2]) for r in rows]
    assert probs == sorted(probs, reverse=True) and probs[0] > 0.5


def test_cli_errors(tmp_path, tiny_model, capsys):
    bad = tmp_path / "bad.trie"
    bad.write_bytes(b"TSNGTRIE" + b"\0" * 100)
    assert main(["ngram", "info", str(bad)]) == 1
    assert "truncated" in capsys.readouterr().err

    ids = tmp_path / "ids.npy"
    np.save(ids, np.arange(50, dtype=np.int32) % 7)
    out = tmp_path / "ids.trie"
    assert main(["ngram", "build", "--order", "3", "--out", str(out), "--quiet", "--workers", "1", str(ids)]) == 0
    capsys.readouterr()
    assert main(["ngram", "query", str(out), "--tokenizer", str(tiny_model), "x"]) == 1
    assert "rebuild with --tokenizer" in capsys.readouterr().err

    assert main(["ngram", "build", "--order", "3", "--out", str(out), "--quiet", str(tmp_path / "none")]) == 2
    assert "does not exist" in capsys.readouterr().err
