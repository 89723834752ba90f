"""The one converter from plain data (parsed YAML, JSON, a Hydra container) to config dataclasses.

Every config in the project is a dataclass that validates itself in ``__post_init__``. Hydra's
entry point gets its instances from ``OmegaConf.to_object`` (the schema is registered with the
ConfigStore); everything else that reads a config from plain data (a trainer job's JSON, an
AReaL-style ``--config`` YAML) goes through ``build_dataclass``, which:

- rejects a key the dataclass does not have, naming its full dotted path;
- recurses into (optional) dataclass fields;
- coerces what YAML and command lines blur (``1e-5`` or ``3`` for a float, ``2.0`` for an int,
  ``2`` for a string) and refuses a value of the wrong kind, naming the field.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar

T = TypeVar("T")


def build_dataclass(cls: type[T], data: Any, path: str = "") -> T:
    """Dataclass ``cls`` from a mapping, recursing into dataclass-typed fields."""
    if not isinstance(data, dict):
        raise ValueError(f"config section {path.rstrip('.') or '<root>'} must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)  # resolves each field in the module of the class that declares it
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ValueError(
            f"unknown config key(s) {', '.join(path + k for k in unknown)} for {cls.__name__}; valid: {', '.join(sorted(names))}"
        )
    return cls(**{name: _coerce(hints[name], value, f"{path}{name}") for name, value in data.items()})


def _coerce(hint: Any, value: Any, path: str) -> Any:
    if value is None:
        return None
    args = typing.get_args(hint)
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        inner = [a for a in args if a is not type(None)]
        return _coerce(inner[0], value, path) if len(inner) == 1 else value
    if dataclasses.is_dataclass(hint):
        return build_dataclass(hint, value, path + ".")
    if hint is float and isinstance(value, (int, str)) and not isinstance(value, bool):
        try:
            return float(value)
        except ValueError:
            raise ValueError(f"{path} must be a number, got {value!r}") from None
    if hint is int and isinstance(value, float) and value.is_integer():
        return int(value)
    if hint is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)  # trial_name=2 on the command line is YAML's int 2
    if hint in (int, str, bool) and not isinstance(value, hint):
        raise ValueError(f"{path} must be {hint.__name__}, got {value!r}")
    if typing.get_origin(hint) is list:
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"{path} must be a list, got {value!r}")
        return [_coerce(args[0], v, f"{path}[{i}]") for i, v in enumerate(value)] if args else list(value)
    return value
