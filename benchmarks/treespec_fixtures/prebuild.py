"""Build every fixture a treespec config names, in the calling process, before an engine starts.

A `fixture:NAME` path (drafter.path, drafter.ngram, drafter.sampled_path) is built on first use.
Left to the engine, that first use is in vLLM's worker, which vLLM's CPU backend pins to its bound
cores: one core of a 2-core host, the other being left to the API server and the engine core. A
fixture that trains for minutes (the Mamba draft LM, the draft heads) then runs on one core while
the other idles, and its minutes count against the engine's startup. Whatever starts an engine
from a config calls `prebuild_fixtures` first (`vllm-treespec serve` does it for every prefixed
path: vllm_treespec.paths.prebuild_paths; the benchmarks and the end-to-end tests through
`prebuild_engine_fixtures`); the worker then finds the fixture in the recipe-keyed cache (cache.py).

Not done: training fixtures in a background process on the core vLLM's engines leave idle
during a test session. Tried and reverted (session 16): beside such a builder, at nice 10 or in
SCHED_IDLE alike, the session's own two-thread fixture training took many times longer; it
would need the builder paused whenever the session trains anything itself.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from treespec_fixtures.resolver import PREFIX

__all__ = ["config_fixtures", "prebuild_fixtures", "prebuild_engine_fixtures"]


def config_fixtures(cfg: Any) -> list[tuple[str, str]]:
    """(key, fixture name) of every `fixture:NAME` path of a parsed config's drafter section."""
    from vllm_treespec.paths import drafter_paths

    return [(key, value[len(PREFIX):]) for key, value, _ in drafter_paths(cfg.drafter) if value.startswith(PREFIX)]


def prebuild_fixtures(cfg: Any, served_model: str | Path | None) -> list[Path]:
    """Build (or find cached) the fixtures `cfg` names; returns their paths.

    Model and head fixtures build from their recipes; trie fixtures need the served model's
    tokenizer (`served_model`, a local directory; without one they are left to the engine). A
    name that is no fixture of its key's kind, or a fixture that cannot serve this model (a
    self-distilled trie of another tokenizer), raises ConfigError naming the key, as the engine
    would."""
    from vllm_treespec.paths import prebuild_paths

    return prebuild_paths(cfg, served_model)


def prebuild_engine_fixtures(engine_kwargs: dict[str, Any], model: str | Path) -> list[Path]:
    """`prebuild_fixtures` for `LLM(model, **engine_kwargs)`: reads the treespec config from
    additional_config (when the speculative model is treespec's). A config that does not parse
    builds nothing, as does a fixture that cannot serve `model`: the engine reports both."""
    from vllm_treespec.config import ConfigError, from_engine_args

    try:
        cfg = from_engine_args(engine_kwargs.get("speculative_config"), engine_kwargs.get("additional_config"))
        return [] if cfg is None else prebuild_fixtures(cfg, model)
    except ConfigError:
        return []
