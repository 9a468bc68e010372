"""Config paths with a prefix (`fixture:NAME`) and named config directories (`demo/NAME`), both
supplied by code outside the installed package.

The package resolves plain paths only. A source checkout's lab (`treespec_fixtures`, which the
wheel does not install) registers a resolver for `fixture:` paths (models, heads and tries it
builds and caches) and a config directory for `demo/` presets. Processes that the lab's caller
starts (a vLLM server, an engine's workers) find them through the environment: TREESPEC_PATH_RESOLVER
names modules (comma-separated) imported on the first prefixed path or unknown preset, each of
which registers what it provides on import; the checkout must be on their PYTHONPATH.

A path whose prefix nobody registered is an error naming the prefix and the fix, never a file
name: write a file name with a colon as `./name`.
"""
from __future__ import annotations

import dataclasses
import importlib
import os
import re
from pathlib import Path
from typing import Any, Callable, Protocol

__all__ = ["ENV_RESOLVER", "KINDS", "PathQuery", "PathResolver", "register_path_resolver", "register_config_dir",
           "config_dirs", "split_prefix", "resolve_path", "locate_path", "drafter_paths", "prebuild_paths"]

ENV_RESOLVER = "TREESPEC_PATH_RESOLVER"
# what a config key needs: an n-gram trie file, a model directory (draft model, training target),
# or a head checkpoint of that drafter type
KINDS = ("trie", "model", "dart", "jetspec")
_PREFIX = re.compile(r"^([A-Za-z][A-Za-z0-9_.-]*):(?!//)")
_RESOLVERS: dict[str, PathResolver] = {}
_CONFIG_DIRS: dict[str, Path] = {}
_IMPORTED: set[str] = set()


@dataclasses.dataclass(frozen=True)
class PathQuery:
    """What a dry run (preflight) asks a resolver about one prefixed path: where it is, without
    building it, plus what it can check without a build."""
    key: str                            # the config key, e.g. "drafter.path"
    spec: str                           # its value, e.g. "fixture:stdlib-3gram"
    name: str                           # the value after the prefix
    kind: str                           # one of KINDS
    tokenizer: Path | None              # the served tokenizer's directory, None when unknown
    fingerprint: Callable[[], str]      # the served tokenizer's fingerprint (needs `tokenizer`)
    expected_order: int | None          # drafter.order when set (tries)


class PathResolver(Protocol):
    """What a prefix's resolver provides."""

    def resolve(self, name: str, kind: str, tokenizer_dir: Path | None) -> Path:
        """The file or directory of `name` for a key of `kind`, built first when it must be
        (trie kinds are built per tokenizer). Raises ValueError naming the choices."""

    def locate(self, query: PathQuery) -> tuple[Path | None, str]:
        """(the existing path, "") or (None, why it is not there and when it will be), building
        nothing. Raises ValueError for a name that cannot serve the key (preflight reports it
        as a config error) or preflight.PreflightError for a finer verdict."""


def register_path_resolver(prefix: str, resolver: PathResolver) -> None:
    """Resolve config paths starting with `prefix` (e.g. "fixture:") with `resolver`."""
    if not _PREFIX.match(prefix) or not prefix.endswith(":"):
        raise ValueError(f"path prefix {prefix!r}: expected a word followed by ':' (e.g. 'fixture:')")
    _RESOLVERS[prefix] = resolver


def register_config_dir(prefix: str, directory: str | Path) -> None:
    """Config names `PREFIX/NAME` (e.g. "demo/lookup-trie") read `directory/NAME.yaml`."""
    if not prefix.endswith("/") or "/" in prefix[:-1]:
        raise ValueError(f"config prefix {prefix!r}: expected one directory name followed by '/' (e.g. 'demo/')")
    _CONFIG_DIRS[prefix] = Path(directory)


def _import_env_resolvers() -> None:
    """Import the modules TREESPEC_PATH_RESOLVER names (once each); they register on import."""
    for module in filter(None, (m.strip() for m in os.environ.get(ENV_RESOLVER, "").split(","))):
        if module in _IMPORTED:
            continue
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ValueError(f"{ENV_RESOLVER}={os.environ[ENV_RESOLVER]}: module {module!r} cannot be imported "
                             f"({e}); put the checkout that holds it on PYTHONPATH, or unset {ENV_RESOLVER}") from None
        _IMPORTED.add(module)


def config_dirs() -> dict[str, Path]:
    """Registered config directories by prefix (after importing TREESPEC_PATH_RESOLVER's modules)."""
    _import_env_resolvers()
    return dict(_CONFIG_DIRS)


def split_prefix(spec: str) -> tuple[str, str] | None:
    """("fixture:", "NAME") for a prefixed value, None for a plain path."""
    m = _PREFIX.match(spec)
    return None if m is None else (spec[:m.end()], spec[m.end():])


def _resolver(spec: str) -> tuple[PathResolver, str] | None:
    """(the resolver, the name after the prefix) of a prefixed value; None for a plain path."""
    split = split_prefix(spec)
    if split is None:
        return None
    prefix, name = split
    if prefix not in _RESOLVERS:
        _import_env_resolvers()
    if prefix not in _RESOLVERS:
        known = ", ".join(sorted(_RESOLVERS)) or "none"
        raise ValueError(
            f"{spec!r}: no resolver handles the prefix {prefix!r} (registered: {known}); give a file or "
            f"directory path (a name with a colon as ./{spec}). `fixture:` paths are the source checkout's "
            f"test fixtures (treespec_fixtures, not installed): set {ENV_RESOLVER}=treespec_fixtures.resolver "
            "with the checkout on PYTHONPATH (importing treespec_fixtures does both)")
    return _RESOLVERS[prefix], name


def resolve_path(spec: str, kind: str, tokenizer_dir: str | Path | None = None) -> Path:
    """A config path value as a local path: a plain path expanded, a prefixed one by its resolver
    (which may build it first). Raises ValueError (without the config key: callers add it)."""
    found = _resolver(spec)
    if found is None:
        return Path(spec).expanduser()
    resolver, name = found
    return resolver.resolve(name, kind, None if tokenizer_dir is None else Path(tokenizer_dir))


def locate_path(query: PathQuery) -> tuple[Path | None, str]:
    """`PathResolver.locate` of a prefixed query.spec (builds nothing)."""
    found = _resolver(query.spec)
    if found is None:
        raise ValueError(f"{query.spec!r} has no prefix; check it as a path")
    return found[0].locate(query)


def drafter_paths(drafter: Any) -> list[tuple[str, str, str]]:
    """(config key, value, kind) of every path a parsed drafter section names (a lookup_trie
    without a file, learning online only, names none)."""
    kind = drafter.type
    if kind in ("ngram_trie", "lookup_trie"):
        found = [] if drafter.path is None else [("drafter.path", drafter.path, "trie")]
        if getattr(drafter, "sampled_path", None) is not None:
            found.append(("drafter.sampled_path", drafter.sampled_path, "trie"))
        return found
    if kind in ("dart", "jetspec"):
        ngram = [] if drafter.ngram is None else [("drafter.ngram", drafter.ngram, "trie")]
        return [("drafter.path", drafter.path, kind), *ngram]
    if kind == "draft_model":
        return [("drafter.path", drafter.path, "model")]
    return []


def prebuild_paths(cfg: Any, tokenizer_dir: str | Path | None) -> list[Path]:
    """Resolve (so build, when a resolver builds) every prefixed path of `cfg`'s drafter in the
    calling process, before an engine starts: a first build left to the engine runs in vLLM's
    worker, which vLLM's CPU backend pins to one core. Tries are built per tokenizer, so without
    `tokenizer_dir` (a local directory; not a hub id) they are left to the engine. Raises
    ConfigError naming the key, as the engine would."""
    from vllm_treespec.schema import ConfigError

    local_tokenizer = tokenizer_dir is not None and Path(tokenizer_dir).is_dir()
    built = []
    for key, value, kind in drafter_paths(cfg.drafter):
        if split_prefix(value) is None or (kind == "trie" and not local_tokenizer):
            continue
        try:
            built.append(resolve_path(value, kind, tokenizer_dir))
        except ValueError as e:
            raise ConfigError(f"{key}: {e}") from None
    return built
