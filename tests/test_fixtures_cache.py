"""The recipe-keyed fixture cache: built once, found afterwards, and nothing left by a killed build."""
from __future__ import annotations

import pytest

from treespec_fixtures import build_fixture
from treespec_fixtures.cache import cached_build, recipe_key


def test_builds_once_then_finds_it(tmp_path, monkeypatch):
    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path))
    calls = []

    def build(d):
        calls.append(d)
        (d / "w.txt").write_text("done")

    first = cached_build("x", {"r": 1}, build)
    assert cached_build("x", {"r": 1}, build) == first and len(calls) == 1
    assert (first / "fixture.json").exists() and (first / "w.txt").read_text() == "done"
    assert cached_build("x", {"r": 2}, build) != first and len(calls) == 2     # another recipe


def test_clears_what_a_killed_build_left(tmp_path, monkeypatch):
    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path))
    stale = tmp_path / "fixtures" / f".x-{recipe_key({'r': 1})}.tmp-999999"
    stale.mkdir(parents=True)
    (stale / "half.bin").write_text("partial")
    out = cached_build("x", {"r": 1}, lambda d: (d / "w.txt").write_text("done"))
    assert (out / "w.txt").read_text() == "done" and not stale.exists()


def test_unknown_fixture_names_the_nearest_one():
    with pytest.raises(ValueError, match=r"unknown fixture 'dart-haed' \(did you mean 'dart-head'\?\)"):
        build_fixture("dart-haed")


def test_lab_cli_prints_the_fixture_path_last(tiny_model):
    """`python -m treespec_fixtures NAME` (benchmarks/ on PYTHONPATH: tests/conftest.py exports it)."""
    import subprocess
    import sys
    from pathlib import Path

    out = subprocess.run([sys.executable, "-m", "treespec_fixtures", "tiny"], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    last = out.stdout.strip().splitlines()[-1]
    assert Path(last) == tiny_model and (Path(last) / "config.json").exists()


def test_moving_the_lab_kept_the_cache_keys():
    """CI caches the heavy fixtures by recipe key (rebuilding them takes tens of minutes): the
    recipes name no module path, except the distilled tries' prompt source, kept verbatim. A
    deliberate recipe change (code-lm trains in float32) updates the pinned key here."""
    from treespec_fixtures.code_lm import CODE_LM_RECIPE
    from treespec_fixtures.tries import DISTILLED_PROMPTS_SOURCE

    assert recipe_key(CODE_LM_RECIPE) == "0b6408d40733"
    assert DISTILLED_PROMPTS_SOURCE == "vllm_treespec.fixtures.corpus.training_prompts"


def test_fixture_cached_looks_without_building(tmp_path, monkeypatch):
    from treespec_fixtures import fixture_cached

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path))
    assert not fixture_cached("tiny")
    assert not (tmp_path / "fixtures").exists()                 # nothing was built or created
    build_fixture("tiny")
    assert fixture_cached("tiny")
    with pytest.raises(ValueError, match="did you mean 'dart-head'"):
        fixture_cached("dart-haed")


def test_trained_fixtures_skip_unless_cached_or_asked_for(tmp_path, monkeypatch):
    """Training heads is a benchmark fixture's job, not CI's (conftest.trained_fixture)."""
    from conftest import TRAIN_FIXTURES_ENV, trained_fixture

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path))
    monkeypatch.delenv(TRAIN_FIXTURES_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception, match=r"python -m treespec_fixtures dart-head"):
        trained_fixture("dart-head")
    monkeypatch.setenv(TRAIN_FIXTURES_ENV, "1")                 # asked for: built (tiny, to be quick)
    assert trained_fixture("tiny") == build_fixture("tiny")
