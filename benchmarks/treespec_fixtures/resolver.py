"""`fixture:NAME` config paths and `demo/NAME` presets for vllm_treespec (registered on import).

The installed package resolves prefixed paths through vllm_treespec.paths, which imports this
module by the name TREESPEC_PATH_RESOLVER gives it (`treespec_fixtures.enable` sets that). Model
and head fixtures come from the registry, trie fixtures from tries.py; `locate` is what
`vllm-treespec config check` (preflight) sees: the checks that need no build (a known name of the
key's kind, a head of drafter.type's kind, a trie's order, a self-distilled trie's tokenizer) and
the cached path, never a build (fixtures train for minutes).
"""
from __future__ import annotations

import json
import multiprocessing
import platform
from pathlib import Path

from vllm_treespec.paths import PathQuery, register_config_dir, register_path_resolver
from vllm_treespec.preflight import EXIT_CONFIG, EXIT_MODEL, PreflightError
from vllm_treespec.schema import did_you_mean

PREFIX = "fixture:"
DEMO_CONFIGS = Path(__file__).resolve().parent / "demo"

__all__ = ["FixtureResolver", "PREFIX", "DEMO_CONFIGS", "registry_fixture_dir"]


def fixtures_root() -> Path:
    from treespec_fixtures.cache import cache_root

    return cache_root() / "fixtures"


def registry_fixture_dir(name: str) -> tuple[Path, bool]:
    """(directory, cached?) of registry fixture `name`, without building it: the path cache.py's
    `cached_build` gives it, complete when its fixture.json marker exists."""
    from treespec_fixtures.cache import recipe_key
    from treespec_fixtures.registry import FIXTURES

    recipe, _ = FIXTURES[name]
    d = fixtures_root() / f"{name}-{recipe_key(recipe)}"
    return d, (d / "fixture.json").is_file()


def _model_names(kind: str) -> tuple[str, list[str]]:
    """(what, names): the registry's fixtures a key of `kind` may name (heads of any kind for a
    head key: a head of the other kind gets its own message)."""
    from treespec_fixtures.registry import FIXTURES

    if kind == "model":
        return "model", sorted(n for n, (recipe, _) in FIXTURES.items() if "head" not in recipe and n != "head-data")
    return "head", sorted(n for n, (recipe, _) in FIXTURES.items() if "head" in recipe)


def _check_model_name(name: str, kind: str) -> None:
    """A model or head fixture's name against the key's kind; ValueError naming the choices."""
    from treespec_fixtures.registry import FIXTURES

    what, names = _model_names(kind)
    if name not in names:
        raise ValueError(f"{PREFIX + name!r} is not a {what} fixture{did_you_mean(name, names)}; {what} fixtures "
                         f"are {', '.join(PREFIX + n for n in names) or 'none'}; or give a directory")
    if what == "head":
        head_kind = FIXTURES[name][0]["head"]["kind"]
        if head_kind != kind:
            raise ValueError(f"{PREFIX + name} is a {head_kind} head; set drafter.type: {head_kind} "
                             f"or use a {kind} head fixture")


def _check_trie_name(name: str) -> None:
    from treespec_fixtures.tries import trie_fixture_names

    names = trie_fixture_names()
    if name not in names:
        raise ValueError(f"unknown trie fixture {PREFIX + name!r}{did_you_mean(name, names)}; choose one of "
                         f"{', '.join(PREFIX + n for n in names)} or give a trie file")


class FixtureResolver:
    """`fixture:NAME`: built (or found in the recipe-keyed cache) on first use."""

    def resolve(self, name: str, kind: str, tokenizer_dir: Path | None) -> Path:
        if kind != "trie":
            from treespec_fixtures.registry import build_fixture

            _check_model_name(name, kind)
            return build_fixture(name)
        from treespec_fixtures.tries import build_trie_fixture

        _check_trie_name(name)
        if tokenizer_dir is None:
            raise ValueError(f"{PREFIX + name} is built per tokenizer: give the model's tokenizer directory")
        # vLLM's workers are daemonic and may not start the builder's worker processes
        single = multiprocessing.current_process().daemon
        return build_trie_fixture(name, tokenizer_dir, workers=1 if single else None)

    def locate(self, query: PathQuery) -> tuple[Path | None, str]:
        if query.kind == "trie":
            return _locate_trie(query)
        _check_model_name(query.name, query.kind)
        d, cached = registry_fixture_dir(query.name)
        if not cached:
            return None, (f"not cached; built on first use (it trains for minutes; `vllm-treespec serve` "
                          f"builds it before vLLM starts), cached at {d}")
        return d, ""


def _locate_trie(query: PathQuery) -> tuple[Path | None, str]:
    """A trie fixture: its name and order now; its file only if the cache holds one for the
    served tokenizer (building one counts a corpus, or runs a model: minutes)."""
    from treespec_fixtures.tries import DISTILLED_TRIE_FIXTURES, TRIE_FIXTURES

    name, spec = query.name, query.spec
    _check_trie_name(name)
    order = (TRIE_FIXTURES.get(name) or DISTILLED_TRIE_FIXTURES[name])["order"]
    if query.expected_order is not None and order != query.expected_order:
        raise PreflightError(EXIT_CONFIG, "drafter.order", (
            f"{query.expected_order} does not match {spec}, which has order {order}; set drafter.order: "
            f"{order} (or null) or use another trie"))
    root = fixtures_root()
    if query.tokenizer is None:
        return None, (f"built on first use for the served model's tokenizer (cached under {root}); "
                      "pass --model to check the cache")
    fingerprint = query.fingerprint()
    note = ""
    if name in DISTILLED_TRIE_FIXTURES:
        note = _check_distilled_source(query, DISTILLED_TRIE_FIXTURES[name]["model"], fingerprint)
    cached = _cached_trie_fixture(name, fingerprint)
    if cached is None:
        return None, (f"not cached for this tokenizer; built on first use (it can take minutes; "
                      f"`vllm-treespec serve` builds it before vLLM starts) under {root}{note}")
    return cached, ""


def _check_distilled_source(query: PathQuery, model_fixture: str, fingerprint: str) -> str:
    """A self-distilled trie fixture counts one fixture model's continuations, so it serves only
    that model's tokenizer: compared now when that model is cached (else after its build)."""
    from vllm_treespec.ngram.fingerprint import tokenizer_fingerprint

    model_dir, cached = registry_fixture_dir(model_fixture)
    if not cached:
        return f"; it needs fixture {model_fixture} (not cached), whose tokenizer must be the served one"
    if tokenizer_fingerprint(model_dir) != fingerprint:
        raise PreflightError(EXIT_MODEL, query.key, (
            f"{query.spec} is counted from the {model_fixture} fixture's continuations with its tokenizer, "
            f"which differs from {query.tokenizer}'s; count this model's own with `vllm-treespec train trie "
            f"MODEL_DIR --out FILE` and set {query.key}: FILE"))
    return ""


def _cached_trie_fixture(name: str, fingerprint: str) -> Path | None:
    """The cached file of trie fixture `name` for `fingerprint`, or None.

    tries.py keys its cache by a recipe it builds inside `build_trie_fixture` (with the train
    split's file count, which takes a directory walk); rather than copy that recipe here, this
    finds the cache entries of that fixture (complete ones have fixture.json, which records the
    recipe) built for this tokenizer, trie format and Python version."""
    from treespec_fixtures.tries import TRIE_FILE
    from vllm_treespec.native import native

    best: tuple[float, Path] | None = None
    for d in fixtures_root().glob(f"ngram-{name}-*"):
        try:
            recipe = json.loads((d / "fixture.json").read_text()).get("recipe", {})
        except (OSError, ValueError, AttributeError):
            continue
        if (recipe.get("name") == name and recipe.get("tokenizer_fingerprint") == fingerprint
                and recipe.get("format_version") == native().ngram.FORMAT_VERSION
                and recipe.get("python") == platform.python_version() and (d / TRIE_FILE).is_file()):
            mtime = (d / "fixture.json").stat().st_mtime
            if best is None or mtime > best[0]:
                best = (mtime, d / TRIE_FILE)
    return None if best is None else best[1]


register_path_resolver(PREFIX, FixtureResolver())
register_config_dir("demo/", DEMO_CONFIGS)
