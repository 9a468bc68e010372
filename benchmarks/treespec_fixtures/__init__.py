"""The repository's lab fixtures: small models, heads and tries built from the running
interpreter's own files (never downloaded), for the demo, the tests and the benchmarks. They live
beside the benchmark harness (benchmarks/ is on the path of the benchmark scripts and, through
tests/conftest.py, of the tests) and are not installed by the wheel: an operator's deployment
names its own files.

Each model fixture is a Hugging Face-format directory (config.json, safetensors, tokenizer) that
vLLM serves as is, in a cache outside the repository keyed by a hash of its recipe, so a changed
recipe never reuses stale weights (`cache.py`). Config values `fixture:NAME` name them, and
`demo/NAME` names the presets of configs/drafters on them (`demo/`).

Importing this package enables both, here and in every process started afterwards (`enable`):
the package resolves them through vllm_treespec.paths, which imports `treespec_fixtures.resolver`
by the name TREESPEC_PATH_RESOLVER gives it.

    PYTHONPATH=benchmarks python -m treespec_fixtures NAME   # build or reuse NAME; prints its path last
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

LAB_PATH = Path(__file__).resolve().parents[1]        # benchmarks/: the sys.path entry of the lab
RESOLVER_MODULE = "treespec_fixtures.resolver"

__all__ = ["FIXTURES", "build_fixture", "enable", "LAB_PATH"]


def _prepend(var: str, value: str, sep: str) -> None:
    """Put `value` first in the `sep`-separated environment variable `var`, once."""
    parts = [p for p in os.environ.get(var, "").split(sep) if p]
    if value not in parts:
        os.environ[var] = sep.join([value, *parts])


def enable() -> None:
    """Resolve `fixture:NAME` and `demo/NAME` in this process (registers the resolver) and in the
    processes it starts: exports TREESPEC_PATH_RESOLVER and the lab's directory on PYTHONPATH, which
    vLLM servers, engine runners and vLLM's spawned workers inherit."""
    import treespec_fixtures.resolver  # noqa: F401  (registers on import)
    from vllm_treespec.paths import ENV_RESOLVER

    _prepend(ENV_RESOLVER, RESOLVER_MODULE, ",")
    _prepend("PYTHONPATH", str(LAB_PATH), os.pathsep)


def __getattr__(name: str) -> Any:
    """FIXTURES, build_fixture and fixture_cached, imported on first use (the registry imports torch)."""
    if name in ("FIXTURES", "build_fixture", "fixture_cached"):
        from treespec_fixtures import registry

        return getattr(registry, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


enable()
