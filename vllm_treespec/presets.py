"""Shipped deployment presets: where they live, how a name or a path resolves, and `preset:` bases.

The presets ship inside the package as `vllm_treespec.configs` (configs/ in the checkout, read
through importlib.resources), so a wheel install resolves them exactly as a source checkout does:

- `configs/drafters/NAME.yaml`: production presets, by name (`prompt-lookup`). Those whose drafter
  needs a file (a trie, a head checkpoint, a draft model) name none: they fail at startup with the
  key and the command that makes the file until one is given.
- `configs/budgets/NAME.yaml`: budget tables (`budget.preset`).
- `PREFIX/NAME`: NAME.yaml in a config directory registered for PREFIX (vllm_treespec/paths.py):
  the source checkout's lab registers `demo/`, the production presets on its fixture files, for
  `make demo`, the benchmarks and the tests. They are not installed.

A config mapping may start from a preset and override keys: `{"preset": "lookup-trie", "drafter":
{"path": "/data/code.trie"}}`. Mappings merge key by key (recursively); any other value replaces
the preset's.
"""
from __future__ import annotations

from importlib import resources
from pathlib import Path
from typing import Any, Callable, Mapping

from vllm_treespec.schema import ConfigError, did_you_mean

PRESET_KEY = "preset"
MAX_PRESET_CHAIN = 8       # preset -> its preset -> ...: deeper is a loop or a mistake

__all__ = ["configs_dir", "drafter_presets", "registered_presets", "budget_presets", "resolve_config_path",
           "resolve_budget_path", "expand_preset", "PRESET_KEY"]


def configs_dir() -> Path:
    """The packaged configs directory, `vllm_treespec.configs` (configs/ in the checkout; a real
    directory: the package is installed unzipped)."""
    return Path(str(resources.files("vllm_treespec.configs")))


def _stems(sub: str) -> list[str]:
    d = configs_dir() / sub
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def drafter_presets() -> list[str]:
    """Production preset names."""
    return _stems("drafters")


def registered_presets() -> list[str]:
    """Preset names of the registered config directories, with their prefix (`demo/NAME`)."""
    from vllm_treespec.paths import config_dirs

    return sorted(prefix + p.stem for prefix, d in config_dirs().items() for p in d.glob("*.yaml"))


def budget_presets() -> list[str]:
    return _stems("budgets")


def _yaml_name(name: str) -> str:
    return name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"


def resolve_config_path(name: str) -> Path:
    """A deployment config file: an existing path (absolute or relative to the working
    directory), a production preset name, or `PREFIX/NAME` of a registered config directory."""
    from vllm_treespec.paths import ENV_RESOLVER, config_dirs

    path = Path(name).expanduser()
    candidates = [path]
    if not path.is_absolute():
        prefix, _, rest = name.partition("/")
        registered = config_dirs() if rest else {}
        if prefix + "/" in registered:
            candidates.append(registered[prefix + "/"] / _yaml_name(rest))
        else:
            candidates.append(configs_dir() / "drafters" / _yaml_name(name))
    for c in candidates:
        if c.is_file():
            return c.resolve()
    extra = registered_presets()
    raise ConfigError(
        f"treespec config {name!r} not found{did_you_mean(name, drafter_presets() + extra)} "
        f"(looked at: {', '.join(str(c) for c in candidates)}); pass an existing YAML path or a "
        f"preset name: {', '.join(drafter_presets()) or 'none found'} (production)"
        + (f" or {', '.join(extra)} (registered)" if extra else
           f"; `demo/` presets are the source checkout's (treespec_fixtures, not installed): set "
           f"{ENV_RESOLVER}=treespec_fixtures.resolver with the checkout on PYTHONPATH"))


def resolve_budget_path(name: str | None) -> Path:
    """A budget table file: a name in configs/budgets/, or an existing YAML path."""
    name = name or ""
    candidates = [configs_dir() / "budgets" / _yaml_name(name), Path(name).expanduser()]
    for c in candidates:
        if name and c.is_file():
            return c.resolve()
    looked = ", ".join(str(c) for c in candidates)
    raise ConfigError(f"budget.preset: {name!r} not found{did_you_mean(name, budget_presets())} "
                      f"(looked at: {looked}); use one of "
                      f"{', '.join(budget_presets()) or 'none found'} or an existing YAML path")


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """`override` on top of `base`: mappings merge key by key, other values replace."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = merge(out[key], value)
        else:
            out[key] = value
    return out


def expand_preset(raw: Any, read: Callable[[Path], Any], source: str = "<inline>") -> tuple[Any, list[str]]:
    """(the mapping with its `preset:` chain merged in, the preset files used, outermost first).

    `read` loads one YAML file (config.read_yaml, which names the file in its errors)."""
    used: list[str] = []
    layers = []
    current = raw
    while isinstance(current, Mapping) and PRESET_KEY in current:
        name = current[PRESET_KEY]
        if not isinstance(name, str) or not name:
            raise ConfigError(f"treespec config {source}: preset: expected a preset name or YAML path, "
                              f"got {name!r}")
        if len(used) >= MAX_PRESET_CHAIN:
            raise ConfigError(f"treespec config {source}: preset: more than {MAX_PRESET_CHAIN} presets "
                              f"deep ({' -> '.join(used)}); a preset names itself in a loop?")
        path = resolve_config_path(name)
        if str(path) in used:
            raise ConfigError(f"treespec config {source}: preset: {name!r} ({path}) is its own base "
                              f"through {' -> '.join(used)}; break the loop")
        used.append(str(path))
        layers.append({k: v for k, v in current.items() if k != PRESET_KEY})
        current = read(path)
        source = str(path)
    merged = current
    for layer in reversed(layers):
        if not isinstance(merged, Mapping):
            break                     # parse_config reports the preset file that is not a mapping
        merged = merge(merged, layer)
    return merged, used
