"""Strict reading of configuration dicts: unknown keys name their nearest valid key, `DLM_` environment variables
override keys (nested with `__`, parsed to the field's type), and overrides merge only what was given."""

import difflib
import typing
from collections.abc import Iterable, Mapping
from dataclasses import fields, is_dataclass
from types import NoneType, UnionType

import yaml

ENV_PREFIX = "DLM_"


def check_keys(keys: Iterable[str], valid: Mapping[str, str], where: str = "") -> None:
    """ValueError for the first key not in valid (name -> its dotted path), naming the nearest valid one."""
    for key in keys:
        if key in valid:
            continue
        near = difflib.get_close_matches(str(key), list(valid), n=1)
        hint = f"did you mean {valid[near[0]]!r}?" if near else f"valid: {', '.join(sorted(valid.values()))}"
        raise ValueError(f"unknown config key {dotted(where, key)!r}; {hint}")


def check_fields(cls, raw: Mapping, where: str) -> None:
    check_keys(raw, {f.name: dotted(where, f.name) for f in fields(cls)}, where)


def dotted(where: str, key: str) -> str:
    return f"{where}.{key}" if where else str(key)


def given(overrides: Mapping) -> dict:
    """Overrides less the ones left unset (None): a flag not given keeps the config's value."""
    return {k: given(v) if isinstance(v, Mapping) else v for k, v in overrides.items() if v is not None}


def merge(base: Mapping, overrides: Mapping) -> dict:
    """base with overrides laid over it, nested mappings merged key by key."""
    out = dict(base)
    for key, value in overrides.items():
        nested = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = merge(out[key], value) if nested else value
    return out


def env_overrides(cls, environ: Mapping[str, str]) -> dict:
    """DLM_SERVING__PORT=8000 -> {"serving": {"port": 8000}}: the nested keys of dataclass cls that environ sets."""
    out: dict = {}
    for name, value in sorted(environ.items()):
        if not name.startswith(ENV_PREFIX):
            continue
        path = name[len(ENV_PREFIX) :].lower().split("__")
        kind, target, where = cls, out, ""
        for i, key in enumerate(path):
            kind = field_type(kind, key, where, name)
            where = dotted(where, key)
            if i == len(path) - 1:
                target[key] = parse(value, kind, name)
            else:
                target = target.setdefault(key, {})
    return out


def field_type(kind, key: str, where: str, env_name: str):
    """The type of kind's key: a dataclass field's annotation, a dict's value type, or Any below that."""
    if is_dataclass(kind):
        types = typing.get_type_hints(kind)
        try:
            check_keys([key], {f.name: dotted(where, f.name) for f in fields(kind)}, where)
        except ValueError as e:
            raise ValueError(f"{env_name}: {e}") from None
        return types[key]
    args = typing.get_args(kind)
    return args[1] if typing.get_origin(kind) is dict and args else typing.Any


def parse(value: str, kind, env_name: str):
    """An environment string as the field's type; mappings and untyped values are YAML."""
    options = typing.get_args(kind) if isinstance(kind, UnionType) else ()
    if NoneType in options:
        if value.strip().lower() in ("", "null", "none"):
            return None
        kind = next(k for k in options if k is not NoneType)
    if kind is str:
        return value
    if kind is bool:
        word = value.strip().lower()
        if word not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            raise ValueError(f"{env_name}: expected a boolean, got {value!r}")
        return word in ("1", "true", "yes", "on")
    if kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            raise ValueError(f"{env_name}: expected {kind.__name__}, got {value!r}") from None
    return yaml.safe_load(value)
