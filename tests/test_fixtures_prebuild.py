"""prebuild_fixtures: the fixtures a config names are built by the caller (on every core) before
an engine starts, not by vLLM's core-pinned worker; configs that name none build nothing, and
configs the engine would reject build nothing in the test/benchmark path. `vllm-treespec serve`
does the same for every prefixed path (vllm_treespec.paths.prebuild_paths)."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.comparison import treespec_engine_kwargs
from vllm_treespec.config import ConfigError, load_config
from treespec_fixtures.prebuild import config_fixtures, prebuild_engine_fixtures, prebuild_fixtures


@pytest.fixture
def builds(monkeypatch):
    """Record build calls instead of training anything."""
    calls: list[tuple[str, str]] = []

    def model(name):
        calls.append(("model", name))
        return Path(f"/cache/{name}")

    def trie(name, tokenizer_dir, **_):
        calls.append(("trie", name))
        if name == "code-lm-distill-5gram":
            raise ValueError(f"trie fixture {name!r} is counted from code-lm's continuations")
        return Path(f"/cache/{name}.trie")

    monkeypatch.setattr("treespec_fixtures.registry.build_fixture", model)
    monkeypatch.setattr("treespec_fixtures.tries.build_trie_fixture", trie)
    return calls


def test_config_fixtures_lists_every_fixture_key():
    assert config_fixtures(load_config("demo/dart", None)) == [("drafter.path", "dart-head"),
                                                          ("drafter.ngram", "stdlib-3gram")]
    assert config_fixtures(load_config("demo/mamba", None)) == [("drafter.path", "mamba-draft-lm")]
    assert config_fixtures(load_config({"drafter": {"type": "draft_model", "path": "/models/d"}}, None)) == []
    assert config_fixtures(load_config("prompt-lookup", None)) == []


def test_prebuild_builds_models_heads_and_tries(builds, tmp_path):
    prebuild_fixtures(load_config("demo/dart", None), tmp_path)
    assert builds == [("model", "dart-head"), ("trie", "stdlib-3gram")]
    builds.clear()
    prebuild_fixtures(load_config("demo/dart", None), None)        # no tokenizer: the trie is left to the engine
    assert builds == [("model", "dart-head")]
    builds.clear()
    with pytest.raises(ConfigError, match="drafter.path: unknown trie fixture 'fixture:nope'"):
        prebuild_fixtures(load_config({"drafter": {"type": "ngram_trie", "path": "fixture:nope"}}, None), tmp_path)
    assert builds == []                                       # not a fixture: nothing built, the key named


def test_prebuild_error_names_the_key(builds, tmp_path):
    cfg = load_config({"drafter": {"type": "lookup_trie", "path": "fixture:code-lm-distill-5gram"}}, None)
    with pytest.raises(ConfigError, match="drafter.path: trie fixture 'code-lm-distill-5gram'"):
        prebuild_fixtures(cfg, tmp_path)


def test_prebuild_engine_fixtures_reads_the_engine_kwargs(builds, tmp_path):
    assert prebuild_engine_fixtures(treespec_engine_kwargs(8, "demo/mamba"), tmp_path) == [Path("/cache/mamba-draft-lm")]
    assert prebuild_engine_fixtures({}, tmp_path) == []                                   # no speculation
    ngram = {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}}
    assert prebuild_engine_fixtures(ngram, tmp_path) == []
    bad = treespec_engine_kwargs(4, {"drafter": {"type": "draft_model", "path": "fixture:draft-lm"},
                                     "budget": {"max_nodes": 9}})
    assert prebuild_engine_fixtures(bad, tmp_path) == []                                  # engine reports it
    distilled = treespec_engine_kwargs(8, {"drafter": {"type": "lookup_trie",
                                                       "path": "fixture:code-lm-distill-5gram"}})
    assert prebuild_engine_fixtures(distilled, tmp_path) == []                            # engine reports it
    assert builds == [("model", "mamba-draft-lm"), ("trie", "code-lm-distill-5gram")]

