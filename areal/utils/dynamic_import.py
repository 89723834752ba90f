"""``import_from_string("pkg.module.Name")``: resolve a dotted (or ``module:attr``) path to an object.

AReaL configs name agents, agent builders and reward functions by such paths
(``agent_builder_path``, ``reward_fn_path``, ``workflow``). The longest importable module prefix
is imported and the rest is walked with ``getattr``, so ``pkg.mod.Class.method`` works too.
Errors name the path and the part that could not be found; an ImportError raised *inside* a
module that does exist propagates unchanged (it is a bug in that module, not a bad path).
"""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any


def import_from_string(path: str) -> Any:
    """The object that ``path`` ("a.b.c" or "a.b:c") names."""
    if not isinstance(path, str) or not path.strip():
        raise ValueError(f"import path must be a non-empty string, got {path!r}")
    if ":" in path:
        module_name, _, attr_path = path.partition(":")
        module = importlib.import_module(module_name)
        return _walk(module, attr_path.split("."), path)
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        module_name = ".".join(parts[:cut])
        if not _module_exists(module_name):
            continue
        return _walk(importlib.import_module(module_name), parts[cut:], path)
    raise ImportError(f"cannot import {path!r}: no module {parts[0]!r}")


def _module_exists(name: str) -> bool:
    # find_spec imports the parents; a missing parent means "not this prefix", not an error.
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:
        return False


def _walk(obj: Any, attrs: list[str], path: str) -> Any:
    for attr in attrs:
        if not attr:
            raise ValueError(f"import path {path!r} has an empty component")
        if not hasattr(obj, attr):
            raise ImportError(f"cannot import {path!r}: {getattr(obj, '__name__', obj)!r} has no attribute {attr!r}")
        obj = getattr(obj, attr)
    return obj
