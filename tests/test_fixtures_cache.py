"""The recipe-keyed fixture cache: built once, found afterwards, and nothing left by a killed build."""
from __future__ import annotations

import pytest

from vllm_treespec.fixtures import build_fixture
from vllm_treespec.fixtures.cache import cached_build, recipe_key


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
