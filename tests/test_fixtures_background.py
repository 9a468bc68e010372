"""Background fixture builds: what is missing, build order, waiting for the code-LM fixture,
and stopping a builder (and what it started) without leaving anything the cache would use."""
from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from vllm_treespec.fixtures import background, registry


@pytest.fixture
def fake_registry(tmp_path, monkeypatch):
    """A private cache with three quick fixtures; `built` records build order."""
    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "cache"))
    built: list[str] = []

    def builder(name):
        def build(out: Path) -> None:
            built.append(name)
            (out / "weights.txt").write_text(name)
        return build

    for name in ("code-lm", "a", "b"):
        monkeypatch.setitem(registry.FIXTURES, name, ({"fake": name}, builder(name)))
    return built


def test_missing_fixtures_lists_uncached_in_order(fake_registry):
    assert background.missing_fixtures(["b", "a", "b"]) == ["b", "a"]
    registry.build_fixture("a")
    assert background.missing_fixtures(["b", "a"]) == ["b"]
    with pytest.raises(ValueError, match="unknown fixture.*nope"):
        background.missing_fixtures(["a", "nope"])


def test_builds_in_order_once_code_lm_exists(fake_registry):
    done = threading.Event()
    worker = threading.Thread(target=lambda: (background.main(["b", "a", "--poll", "0.05"]), done.set()))
    worker.start()
    time.sleep(0.3)
    assert fake_registry == [] and not done.is_set()      # waits for the code-LM fixture
    registry.build_fixture("code-lm")
    worker.join(10)
    assert done.is_set() and fake_registry == ["code-lm", "b", "a"]
    assert background.missing_fixtures(["a", "b"]) == []


def test_stop_ends_the_builder(tmp_path, monkeypatch):
    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path / "empty"))     # no code-lm: it waits
    proc = background.start_background_build(["dart-head"], tmp_path / "log.txt")
    time.sleep(0.5)
    assert proc.poll() is None
    background.stop_background_build(proc)
    assert proc.poll() is not None
    background.stop_background_build(proc)               # stopping twice is harmless
    assert not (tmp_path / "empty" / "fixtures").exists() or not any((tmp_path / "empty" / "fixtures").iterdir())


def test_start_refuses_unknown_names(tmp_path):
    with pytest.raises(ValueError, match="unknown fixture"):
        background.start_background_build(["no-such-fixture"], tmp_path / "log.txt")


def test_cache_clears_what_a_killed_build_left(tmp_path, monkeypatch):
    from vllm_treespec.fixtures.cache import cached_build, recipe_key

    monkeypatch.setenv("TREESPEC_CACHE", str(tmp_path))
    stale = tmp_path / "fixtures" / f".x-{recipe_key({'r': 1})}.tmp-999999"
    stale.mkdir(parents=True)
    (stale / "half.bin").write_text("partial")
    out = cached_build("x", {"r": 1}, lambda d: (d / "w.txt").write_text("done"))
    assert (out / "w.txt").read_text() == "done" and not stale.exists()
