"""A small typed-schema engine for deployment configs: one declaration gives validation, defaults,
clear errors and the generated reference.

Why not pydantic: errors must name the full dotted key, the allowed values and the fix in one line
an operator can act on, and the same declarations render the configuration reference
(docs/configuration.md).
A section is a frozen dataclass whose fields carry `Field` metadata (`field(metadata=...)`).
"""
from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from dataclasses import MISSING
from typing import Any, Mapping


_UNIONS = (typing.Union, types.UnionType)


class ConfigError(ValueError):
    """An invalid deployment config; the message names the key, what is allowed and the fix."""


def did_you_mean(word: Any, options: typing.Iterable[Any]) -> str:
    """The suffix ` (did you mean 'x'?)` naming the option closest to a misspelt string, else "":
    typos in keys and choices are the most common config mistake, and the nearest name is the fix."""
    if not isinstance(word, str):
        return ""
    names = [o for o in options if isinstance(o, str)]
    close = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


@dataclasses.dataclass(frozen=True)
class Spec:
    """Constraints and documentation of one config key."""
    doc: str
    choices: tuple[Any, ...] | None = None
    ge: float | None = None
    le: float | None = None
    missing: str | None = None      # required keys: how to get a value (said when it is missing)


def spec(default: Any = MISSING, *, doc: str, choices: tuple[Any, ...] | None = None,
         ge: float | None = None, le: float | None = None, default_factory: Any = MISSING,
         missing: str | None = None) -> Any:
    """Declare a config field: `x: int = spec(5, doc="...", ge=1)`; a required key (no default)
    may say how to get its value (`missing=`), which its missing-key error repeats."""
    meta = {"spec": Spec(doc=doc, choices=choices, ge=ge, le=le, missing=missing)}
    if default_factory is not MISSING:
        return dataclasses.field(default_factory=default_factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in _UNIONS:
        return " or ".join(_type_name(a) for a in typing.get_args(tp))
    if origin is typing.Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if tp is type(None):
        return "null"
    return getattr(tp, "__name__", str(tp))


def _check_scalar(key: str, value: Any, tp: Any) -> Any:
    if tp is Any:  # validated by the owning section (e.g. a tagged union)
        return value
    if tp is type(None):
        if value is None:
            return None
        raise ConfigError(f"{key}: expected null, got {value!r}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r} ({type(value).__name__})")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected an integer, got {value!r} ({type(value).__name__})")
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        raise ConfigError(f"{key}: expected a number, got {value!r} ({type(value).__name__})")
    if tp is str:
        if isinstance(value, str):
            return value
        raise ConfigError(f"{key}: expected a string, got {value!r} ({type(value).__name__})")
    if dataclasses.is_dataclass(tp):
        return parse_section(tp, value, key)
    raise TypeError(f"schema type {tp!r} of {key} is not supported")  # a bug in the schema


def _check_value(key: str, value: Any, tp: Any) -> Any:
    origin = typing.get_origin(tp)
    if origin in _UNIONS:
        rest = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is not None and len(rest) == 1:   # X | None: keep X's error about a nested key
            try:
                return _check_value(key, value, rest[0])
            except ConfigError as e:
                if not str(e).startswith(f"{key}:"):
                    raise
            raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
        for alt in typing.get_args(tp):
            try:
                return _check_value(key, value, alt)
            except ConfigError:
                pass
        raise ConfigError(f"{key}: expected {_type_name(tp)}, got {value!r}")
    if origin is typing.Literal:
        allowed = typing.get_args(tp)
        if value in allowed and type(value) in {type(a) for a in allowed}:
            return value
        raise ConfigError(f"{key}: {value!r} is not allowed{did_you_mean(value, allowed)}; choose one of "
                          + ", ".join(repr(a) for a in allowed))
    if origin in (tuple, list):
        (item_tp, *_rest) = typing.get_args(tp) or (Any,)
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return tuple(_check_value(f"{key}[{i}]", v, item_tp) for i, v in enumerate(value))
    return _check_scalar(key, value, tp)


def _check_spec(key: str, value: Any, s: Spec) -> None:
    if value is None:
        return
    if s.choices is not None and value not in s.choices:
        raise ConfigError(f"{key}: {value!r} is not allowed{did_you_mean(value, s.choices)}; choose one of "
                          + ", ".join(repr(c) for c in s.choices))
    if s.ge is not None and value < s.ge or s.le is not None and value > s.le:
        lo = "-inf" if s.ge is None else s.ge
        hi = "inf" if s.le is None else s.le
        raise ConfigError(f"{key}: {value!r} is out of range; allowed {lo} <= {key.rsplit('.', 1)[-1]} <= {hi}")


def parse_section(cls: type, raw: Any, prefix: str) -> Any:
    """Validate mapping `raw` against dataclass `cls`; `prefix` is its dotted key for errors."""
    where = prefix or "config"
    if raw is None:
        raw = {}
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{where}: expected a mapping of keys, got {raw!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    # Every problem of the section at once (unknown keys, then each bad key in declaration
    # order), so one edit of the file fixes them all; cross-key checks run once keys are valid.
    errors = []
    unknown = [k for k in raw if k not in fields]
    if unknown:
        named = "; ".join(f"{_join(prefix, str(k))}: unknown key{did_you_mean(k, fields)}" for k in unknown)
        errors.append(f"{named}; allowed keys in {where} are " + ", ".join(sorted(fields)))
    values = {}
    for name, f in fields.items():
        try:
            values[name] = _field_value(f, _join(prefix, name), raw, hints[name])
        except ConfigError as e:
            errors.append(str(e))
    if errors:
        raise ConfigError("; ".join(errors))
    obj = cls(**values)
    check = getattr(obj, "validate", None)
    if check is not None:
        check(prefix)
    return obj


def _field_value(f: dataclasses.Field, key: str, raw: Mapping, tp: Any) -> Any:
    """The checked value of one field: from `raw`, or its default."""
    if f.name in raw:
        value = _check_value(key, raw[f.name], tp)
    elif f.default is not MISSING:
        value = f.default
    elif f.default_factory is not MISSING:
        value = f.default_factory()
    else:
        hint = getattr(f.metadata.get("spec"), "missing", None)
        raise ConfigError(f"{key}: required key is missing" + (f"; {hint}" if hint else ""))
    s = f.metadata.get("spec")
    if s is not None:
        _check_spec(key, value, s)
    return value


def _join(prefix: str, name: str) -> str:
    return f"{prefix}.{name}" if prefix else name


def to_dict(obj: Any) -> Any:
    """The plain-data form of a parsed section (for logging and round trips)."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    if isinstance(obj, tuple):
        return [to_dict(v) for v in obj]
    return obj


def reference_rows(cls: type, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(key, type, default, description) rows for every key under `cls`, for the docs."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        key = _join(prefix, f.name)
        tp = hints[f.name]
        s = f.metadata.get("spec")
        if dataclasses.is_dataclass(tp):
            rows.append((key, "mapping", "", s.doc if s else ""))
            rows.extend(reference_rows(tp, key))
            continue
        default = "" if f.default is MISSING else repr(f.default)
        doc = s.doc if s else ""
        if s and (s.ge is not None or s.le is not None):
            doc += f" Range: {'' if s.ge is None else s.ge}..{'' if s.le is None else s.le}."
        if s and s.choices:
            doc += " Choices: " + ", ".join(repr(c) for c in s.choices) + "."
        rows.append((key, _type_name(tp), default, doc))
    return rows
