"""Prefixed config paths (vllm_treespec/paths.py): plain paths pass through, `fixture:` paths
resolve through the lab's resolver (benchmarks/treespec_fixtures, enabled by tests/conftest.py),
and a prefix nobody registered, or a resolver module that cannot be imported, is an error that
names the fix. A process without the lab's environment sees the installed package alone."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from vllm_treespec import paths
from vllm_treespec.config import ConfigError, load_config


def test_plain_paths_are_expanded_not_resolved(tmp_path):
    assert paths.resolve_path(str(tmp_path / "x.trie"), "trie") == tmp_path / "x.trie"
    assert paths.resolve_path("~/x.trie", "trie") == Path.home() / "x.trie"
    assert paths.split_prefix("./a:b") is None and paths.split_prefix("/data/a:b") is None
    assert paths.split_prefix("fixture:code-lm") == ("fixture:", "code-lm")


def test_the_lab_is_enabled_for_child_processes():
    assert "treespec_fixtures.resolver" in os.environ[paths.ENV_RESOLVER].split(",")
    assert str(Path(__file__).resolve().parents[1] / "benchmarks") in os.environ["PYTHONPATH"].split(os.pathsep)
    assert "fixture:" in paths._RESOLVERS and "demo/" in paths.config_dirs()


def test_fixture_names_are_checked_against_the_key_kind(tiny_model):
    with pytest.raises(ValueError, match="unknown trie fixture 'fixture:nope'.*fixture:stdlib-3gram"):
        paths.resolve_path("fixture:nope", "trie", tiny_model)
    with pytest.raises(ValueError, match="built per tokenizer"):
        paths.resolve_path("fixture:stdlib-3gram", "trie", None)
    with pytest.raises(ValueError, match="'fixture:dart-head' is not a model fixture"):
        paths.resolve_path("fixture:dart-head", "model")
    with pytest.raises(ValueError, match="is a dart head; set drafter.type: dart"):
        paths.resolve_path("fixture:dart-head", "jetspec")
    assert paths.resolve_path("fixture:tiny", "model") == tiny_model


def test_unknown_prefix_names_the_prefix_and_the_fix():
    with pytest.raises(ValueError) as info:
        paths.resolve_path("nosuch:thing", "trie")
    msg = str(info.value)
    assert "no resolver handles the prefix 'nosuch:'" in msg and "./nosuch:thing" in msg
    assert f"{paths.ENV_RESOLVER}=treespec_fixtures.resolver" in msg


def test_registering_checks_the_prefix_form():
    with pytest.raises(ValueError, match="expected a word followed by ':'"):
        paths.register_path_resolver("fixture", object())
    with pytest.raises(ValueError, match="one directory name followed by '/'"):
        paths.register_config_dir("demo", "/tmp")


def test_prebuild_paths_names_the_key(monkeypatch, tmp_path):
    cfg = load_config({"drafter": {"type": "ngram_trie", "path": "fixture:stdlib-4gram"}}, None)
    with pytest.raises(ConfigError, match=r"^drafter.path: unknown trie fixture 'fixture:stdlib-4gram'"):
        paths.prebuild_paths(cfg, tmp_path)
    assert paths.prebuild_paths(cfg, None) == []                  # tries need the served tokenizer
    assert paths.prebuild_paths(load_config({"drafter": {"type": "ngram_trie", "path": str(tmp_path)}}, None),
                                tmp_path) == []                   # a plain path is the engine's to check


def _without_lab(code: str) -> subprocess.CompletedProcess:
    """`python -c CODE` with the package but not the lab on the path, TREESPEC_PATH_RESOLVER as given."""
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop(paths.ENV_RESOLVER, None)
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=root, capture_output=True, text=True,
                          timeout=120)


def test_without_the_lab_fixture_paths_and_demo_presets_say_how_to_enable_it():
    code = """
import os
from vllm_treespec.drafters.ngram_trie import load_checked_trie
from vllm_treespec.config import load_config
for attempt in (lambda: load_checked_trie("fixture:stdlib-3gram", None, None),
                lambda: load_config("demo/lookup-trie")):
    try:
        attempt()
    except Exception as e:
        print(type(e).__name__, e)
os.environ["TREESPEC_PATH_RESOLVER"] = "no_such_resolver"
try:
    load_checked_trie("fixture:stdlib-3gram", None, None)
except Exception as e:
    print(type(e).__name__, e)
"""
    out = _without_lab(code)
    assert out.returncode == 0, out.stderr[-2000:]
    trie, demo, missing = out.stdout.strip().splitlines()
    assert trie.startswith("ConfigError drafter.path: 'fixture:stdlib-3gram': no resolver handles the prefix")
    assert demo.startswith("ConfigError treespec config 'demo/lookup-trie' not found")
    assert "TREESPEC_PATH_RESOLVER=treespec_fixtures.resolver" in demo
    assert "TREESPEC_PATH_RESOLVER=no_such_resolver: module 'no_such_resolver' cannot be imported" in missing


@pytest.mark.slow
def test_stdlib_fixture_trie(tiny_model):
    """The stdlib-3gram fixture builds (or is reused) for a tokenizer and carries its fingerprint."""
    from vllm_treespec.ngram import NgramTrie, tokenizer_fingerprint

    path = paths.resolve_path("fixture:stdlib-3gram", "trie", tiny_model)
    assert paths.resolve_path("fixture:stdlib-3gram", "trie", tiny_model) == path  # cached
    trie = NgramTrie.load(path, expected_fingerprint=tokenizer_fingerprint(tiny_model))
    assert trie.order == 3 and trie.stats()["total_tokens"] > 1_000_000
    assert trie.stats()["bytes_per_node"] <= 16
