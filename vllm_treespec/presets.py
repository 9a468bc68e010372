"""Shipped deployment presets: where they live, how a name or a path resolves, and `preset:` bases.

The presets ship inside the package (`vllm_treespec/configs/`, read through importlib.resources),
so a wheel install resolves them exactly as a source checkout does:

- `configs/drafters/NAME.yaml`: production presets, by name (`prompt-lookup`). Those whose drafter
  needs a file (a trie, a head checkpoint, a draft model) name none: they fail at startup with the
  key and the command that makes the file until one is given.
- `configs/demo/NAME.yaml`: the same presets on the fixture files (`demo/NAME`), for `make demo`,
  the benchmarks and the tests; not for another model (the fixtures' tokenizer is their own).
- `configs/budgets/NAME.yaml`: budget tables (`budget.preset`).

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
DEMO_PREFIX = "demo/"
MAX_PRESET_CHAIN = 8       # preset -> its preset -> ...: deeper is a loop or a mistake

__all__ = ["configs_dir", "drafter_presets", "demo_presets", "budget_presets", "resolve_config_path",
           "resolve_budget_path", "expand_preset", "PRESET_KEY"]


def configs_dir() -> Path:
    """The packaged configs directory (a real directory: the package is installed unzipped)."""
    return Path(str(resources.files("vllm_treespec") / "configs"))


def _stems(sub: str) -> list[str]:
    d = configs_dir() / sub
    return sorted(p.stem for p in d.glob("*.yaml")) if d.is_dir() else []


def drafter_presets() -> list[str]:
    """Production preset names."""
    return _stems("drafters")


def demo_presets() -> list[str]:
    """Demo preset names, with their `demo/` prefix."""
    return [DEMO_PREFIX + s for s in _stems("demo")]


def budget_presets() -> list[str]:
    return _stems("budgets")


def _yaml_name(name: str) -> str:
    return name if name.endswith((".yaml", ".yml")) else f"{name}.yaml"


def resolve_config_path(name: str) -> Path:
    """A deployment config file: an existing path (absolute or relative to the working
    directory), a production preset name, or `demo/NAME`."""
    path = Path(name).expanduser()
    candidates = [path]
    if not path.is_absolute():
        if name.startswith(DEMO_PREFIX):
            candidates.append(configs_dir() / "demo" / _yaml_name(name[len(DEMO_PREFIX):]))
        else:
            candidates.append(configs_dir() / "drafters" / _yaml_name(name))
    for c in candidates:
        if c.is_file():
            return c.resolve()
    names = drafter_presets() + demo_presets()
    raise ConfigError(
        f"treespec config {name!r} not found{did_you_mean(name, names)} "
        f"(looked at: {', '.join(str(c) for c in candidates)}); pass an existing YAML path or a "
        f"preset name: {', '.join(drafter_presets()) or 'none found'} (production) or "
        f"{', '.join(demo_presets()) or 'none found'} (fixture demos)")


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
