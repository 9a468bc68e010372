"""Bad deployment configs fail with one clear error naming the key and the fix."""
from __future__ import annotations

import pytest

from vllm_treespec.config import (CONFIGS_DIR, ConfigError, config_reference, from_additional_config,
                                  from_engine_args, load_config, resolve_path)
from vllm_treespec.presets import drafter_presets, registered_presets

OK = {"drafter": {"type": "prompt_lookup"}}
DM = {"type": "draft_model", "path": "fixture:draft-lm"}


def test_shipped_preset_is_valid():
    cfg = load_config(str(CONFIGS_DIR / "drafters" / "prompt-lookup.yaml"), 8)
    assert cfg.drafter.type == "prompt_lookup"
    assert cfg.node_budget(8) == 8
    assert load_config("prompt-lookup", 8) == cfg  # preset name resolves to the same file


FILE_FREE = ("prompt-lookup", "prompt-lookup-tree", "lookup-online")      # production presets that need no file


@pytest.mark.parametrize("preset", drafter_presets())
def test_production_presets_name_no_fixture_and_say_what_file_they_need(preset):
    """A production preset runs blind (model-free) or fails at once naming the key and the
    command that makes the file; none points at a test fixture."""
    text = (CONFIGS_DIR / "drafters" / f"{preset}.yaml").read_text()
    assert "fixture:" not in "\n".join(l.split("#")[0] for l in text.splitlines())
    if preset in FILE_FREE:
        assert load_config(preset, 64).source.endswith(f"{preset}.yaml")
        return
    with pytest.raises(ConfigError) as e:
        load_config(preset, 64)
    msg = str(e.value)
    assert "drafter.path: required key is missing" in msg and "needs" in msg
    assert f'"preset": "{preset}"' in msg                  # how to give it the file


@pytest.mark.parametrize("preset", [p for p in registered_presets() if p.startswith("demo/")])
def test_every_demo_preset_extends_its_production_preset(preset):
    cfg = load_config(preset, 64)
    base = preset.split("/", 1)[1]
    assert cfg.source.endswith(f"(preset {CONFIGS_DIR / 'drafters' / base}.yaml)")
    assert cfg.drafter.path.startswith("fixture:")


def test_preset_key_merges_overrides_over_a_preset(tmp_path):
    cfg = load_config({"preset": "lookup-trie", "drafter": {"path": "/data/code.trie", "k": 2},
                       "budget": {"max_nodes": 4}}, 16)
    base = load_config("demo/lookup-trie", 16)
    assert (cfg.drafter.path, cfg.drafter.k, cfg.drafter.max_matches) == ("/data/code.trie", 2, base.drafter.max_matches)
    assert cfg.tree == base.tree and cfg.budget.max_nodes == 4
    chained = tmp_path / "mine.yaml"
    chained.write_text("preset: demo/lookup-trie\ntree: {max_depth: 4}\n")
    assert load_config(str(chained), 16).tree.max_depth == 4
    loop = tmp_path / "loop.yaml"
    loop.write_text(f"preset: {loop}\n")
    with pytest.raises(ConfigError, match="is its own base"):
        load_config(str(loop), 16)
    with pytest.raises(ConfigError, match=r"'lookup-tri' not found \(did you mean 'lookup-trie'\?\)"):
        load_config({"preset": "lookup-tri"}, 16)
    with pytest.raises(ConfigError, match=r"drafter.k: .*out of range"):
        load_config({"preset": "demo/lookup-trie", "drafter": {"k": 0}}, 16)


def test_missing_treespec_entry_uses_default_preset():
    """The default is model-free: prompt lookup plus a trie learnt online, no file."""
    for missing in ({}, None):
        drafter = from_additional_config(missing, 4).drafter
        assert drafter.type == "lookup_trie" and drafter.path is None and drafter.online_mb > 0


def test_engine_args_name_treespec_or_not():
    spec = {"model": "vllm_treespec.TreeProposer", "method": "custom_class", "num_speculative_tokens": 8}
    cfg = from_engine_args(spec, {"treespec": {**OK, "budget": {"max_nodes": 3}}})
    assert cfg is not None and cfg.node_budget(8) == 3
    assert from_engine_args({"method": "ngram", "num_speculative_tokens": 4}, {"treespec": OK}) is None
    assert from_engine_args(None, None) is None
    with pytest.raises(ConfigError, match="additional-config"):
        from_engine_args(spec, ["not", "a", "mapping"])


def test_inline_mapping_and_budget():
    cfg = from_additional_config({"treespec": {**OK, "budget": {"max_nodes": 3}}}, 8)
    assert cfg.node_budget(8) == 3


@pytest.mark.parametrize("raw, needles", [
    ({"drafter": {"type": "nope"}}, ["drafter.type", "'nope'", "prompt_lookup"]),
    ({"drafter": {"type": "prompt_lookup", "min_gram": 2}}, ["drafter.min_gram", "unknown key", "min_ngram"]),
    ({"drafter": {"type": "prompt_lookup", "min_ngram": "2"}}, ["drafter.min_ngram", "integer", "'2'"]),
    ({"drafter": {"type": "prompt_lookup", "min_ngram": 0}}, ["drafter.min_ngram", "out of range", "1 <= min_ngram <= 64"]),
    ({"drafter": {"type": "prompt_lookup", "max_ngram": 100}}, ["drafter.max_ngram", "out of range"]),
    ({"drafter": {"type": "prompt_lookup", "min_ngram": 5, "max_ngram": 2}}, ["drafter.min_ngram", "min_ngram <= max_ngram"]),
    ({"drafter": {"type": "prompt_lookup", "min_ngram": True}}, ["drafter.min_ngram", "integer"]),
    ({**OK, "tree": {"builder": "beam"}}, ["tree.builder", "'beam'", "'chain'"]),
    ({**OK, "tree": {"builder": "best_first", "topk": 4}}, ["prompt_lookup", "max_depth"]),
    ({"drafter": {"type": "ngram_trie", "path": "fixture:stdlib-3gram"}, "tree": {"builder": "beam", "tau": 0.1}},
     ["tree.tau", "not used by builder 'beam'"]),
    ({"drafter": {"type": "ngram_trie", "path": "fixture:stdlib-3gram"}, "tree": {"builder": "threshold", "tau": 2.0}},
     ["tree", "'tau'", "(0.0, 1.0]"]),
    ({"drafter": {"type": "ngram_trie", "path": "fixture:stdlib-3gram"}, "tree": {"builder": "best_first", "scorer": "presto",
                                                  "weights": {"beta": 1.0}}},
     ["tree.weights.beta", "scorer 'presto'", "lam"]),
    ({"drafter": {"type": "ngram_trie", "path": "fixture:stdlib-3gram"}, "tree": {"builder": "threshold", "scorer": "dart"}},
     ["tree.scorer", "best_first or beam"]),
    ({"drafter": {"type": "ngram_trie", "path": "fixture:stdlib-3gram"}, "tree": {"builder": "static", "template": [4, 0]}},
     ["tree", "template"]),
    ({"drafter": {"type": "prompt_lookup", "max_matches": 0}}, ["drafter.max_matches", "out of range"]),
    ({"drafter": {"type": "prompt_lookup", "continue_prob": 0.0}},
     ["drafter.continue_prob", "0 < continue_prob <= 1"]),
    ({"drafter": {"type": "prompt_lookup", "continue_prob": 1.5}}, ["drafter.continue_prob", "out of range"]),
    ({**OK, "budget": {"max_nodes": 0}}, ["budget.max_nodes", "out of range"]),
    ({**OK, "budget": {"max_nodes": 9}}, ["budget.max_nodes", "num_speculative_tokens=8", "lower max_nodes"]),
    ({**OK, "budget": "big"}, ["budget", "expected a mapping"]),
    ({**OK, "budgets": {}}, ["budgets", "unknown key", "budget"]),
    ({"tree": {}}, ["drafter", "required"]),
    ({"drafter": "prompt_lookup"}, ["drafter", "type"]),
    ([1, 2], ["a YAML path, a preset name or a mapping"]),
    ({"drafter": {"type": "draft_model"}}, ["drafter.path", "required"]),
    ({"drafter": {**DM, "dtype": "fp8"}}, ["drafter.dtype", "'fp8'", "'bfloat16'"]),
    ({"drafter": {**DM, "memory_mb": 0}}, ["drafter.memory_mb", "out of range"]),
    ({"drafter": {**DM, "max_cached_requests": 0}}, ["drafter.max_cached_requests", "out of range"]),
    ({"drafter": {**DM, "topk": 0}}, ["drafter.topk", "out of range"]),
    ({"drafter": {**DM, "bandit_ucb": -1}}, ["drafter.bandit_ucb", "out of range"]),
    ({"drafter": {**DM, "draft_sampling": "random"}}, ["drafter.draft_sampling", "'random'", "'sample'"]),
    ({"drafter": {**DM, "draft_sampling": "sample"}, "tree": {"builder": "best_first"}},
     ["drafter.draft_sampling", "draw order", "'best_first'", "draft_sampling: top_k"]),
    ({"drafter": {**DM, "templates": [[3, 0]]}, "tree": {"builder": "static"}},
     ["drafter.templates[0]", "int in [1, 1024], got 0"]),
    ({"drafter": {**DM, "templates": [[3, 2], [2000]]}, "tree": {"builder": "static"}},
     ["drafter.templates[1]", "got 2000"]),
    ({"drafter": {**DM, "templates": [[3, 2]]}, "tree": {"builder": "threshold"}},
     ["drafter.templates", "tree.builder static", "'threshold'"]),
    ({"drafter": DM, "tree": {"builder": "beam"}}, ["tree.builder", "'beam'", "draft_model"]),
    ({"drafter": DM, "tree": {"builder": "best_first", "prefetch": 0}}, ["tree.prefetch", "out of range"]),
    ({"drafter": DM, "tree": {"builder": "threshold", "prefetch": 2}}, ["tree.prefetch", "not used by builder"]),
    ({"drafter": {"type": "ngram_trie", "path": "fixture:stdlib-3gram"}, "tree": {"builder": "best_first", "prefetch": 2}},
     ["tree.prefetch", "only draft_model", "remove tree.prefetch"]),
    ({"drafter": DM, "tree": {"builder": "best_first", "scorer": "presto"}},
     ["tree.scorer", "draft_model", "remove tree.scorer"]),
])
def test_bad_values_name_the_key(raw, needles):
    assert_config_error(raw, needles)


def assert_config_error(raw, needles) -> None:
    """load_config(raw) fails with a message holding every needle."""
    with pytest.raises(ConfigError) as e:
        load_config(raw, 8)
    msg = str(e.value)
    for needle in needles:
        assert needle in msg, f"{needle!r} missing from: {msg}"


@pytest.mark.parametrize("raw, needles", [
    ({"drafter": {"type": "lookup_tree"}}, ["drafter.type", "(did you mean 'lookup_trie'?)"]),
    ({"drafter": {"type": "ngram_trie", "path": "fixture:stdlib-3gram"}, "tree": {"builder": "treshold"}},
     ["tree.builder", "(did you mean 'threshold'?)"]),
    ({"drafter": {"type": "ngram_trie", "path": "fixture:stdlib-3gram"}, "tree": {"builder": "beam", "beam_width": 4, "tpyo": 1}},
     ["tree.beam_width: unknown key (did you mean 'width'?)", "tree.tpyo: unknown key;", "allowed keys in tree"]),
    ({"drafter": {**DM, "draft_sampling": "sampled"}}, ["drafter.draft_sampling", "(did you mean 'sample'?)"]),
])
def test_typos_get_the_nearest_name(raw, needles):
    assert_config_error(raw, needles)


def test_every_bad_key_is_named_at_once():
    raw = {"drafter": {"type": "prompt_lookup", "min_ngram": 0, "max_ngram": "4"},
           "tree": {"builder": "chian", "max_depth": 0}, "budget": {"max_nodes": 0}}
    assert_config_error(raw, ["drafter.min_ngram: 0 is out of range", "drafter.max_ngram: expected an integer",
                              "tree.builder: 'chian' is not allowed (did you mean 'chain'?)",
                              "tree.max_depth: 0 is out of range", "budget.max_nodes: 0 is out of range"])


def test_no_suggestion_without_a_close_name():
    with pytest.raises(ConfigError) as e:
        load_config({"drafter": {"type": "ngram_trie", "path": "fixture:stdlib-3gram"}, "tree": {"builder": "zzz"}}, 8)
    assert "did you mean" not in str(e.value)
    with pytest.raises(ConfigError, match=r"'lookup-trie-distiled' not found \(did you mean 'lookup-trie-distilled'\?\)"):
        load_config("lookup-trie-distiled", 8)


def test_missing_file_names_path_and_presets(tmp_path):
    with pytest.raises(ConfigError) as e:
        load_config(str(tmp_path / "nope.yaml"), 8)
    assert "nope.yaml" in str(e.value) and "not found" in str(e.value) and "prompt-lookup" in str(e.value)


def test_bad_yaml_and_bad_values_in_file_name_the_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("drafter: {type: prompt_lookup\n")
    with pytest.raises(ConfigError, match="bad.yaml.*not valid YAML"):
        load_config(str(bad), 8)
    bad.write_text("drafter:\n  type: prompt_lookup\n  max_ngram: -1\n")
    with pytest.raises(ConfigError, match=r"bad.yaml.*drafter.max_ngram"):
        load_config(str(bad), 8)


def test_additional_config_must_be_a_mapping():
    with pytest.raises(ConfigError, match="additional-config"):
        from_additional_config("treespec", 8)
    with pytest.raises(ConfigError, match="treespec"):
        from_additional_config({"treespec": 5}, 8)


def test_reference_lists_every_key():
    ref = config_reference()
    for key in ["drafter.min_ngram", "drafter.max_ngram", "tree.builder", "budget.max_nodes", "budget.mode"]:
        assert f"`{key}`" in ref


def test_resolve_path_prefers_existing_file(tmp_path):
    f = tmp_path / "x.yaml"
    f.write_text("drafter: {type: prompt_lookup}\n")
    assert resolve_path(str(f)) == f.resolve()


def test_tree_section_gives_builder_params():
    cfg = load_config({"drafter": {"type": "ngram_trie", "path": "fixture:stdlib-3gram"},
                       "tree": {"builder": "beam", "width": 4, "topk": 8, "scorer": "dart",
                                "weights": {"ngram_weight": 0.3}}}, 16)
    assert cfg.tree.builder_params() == {"topk": 8, "width": 4, "scorer": "dart",
                                         "scorer_params": {"ngram_weight": 0.3}}
    for preset in ("prompt-lookup-tree", "demo/ngram-trie-tree"):
        assert load_config(preset, 16).tree.builder == "best_first"
