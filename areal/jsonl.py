"""Strict JSON lines for every ``.jsonl`` file the project writes.

RFC 8259 has no NaN or Infinity, which ``json.dumps`` writes bare by default, and which then
break every strict reader of ``episodes.jsonl`` or ``metrics.jsonl``. ``json_line`` writes every
non-finite float, however nested, as null.
"""

from __future__ import annotations

import json
import math


def json_line(record: dict) -> str:
    """``record`` as one line of strict JSON, newline included; non-finite floats become null."""
    return json.dumps(_finite_or_null(record), allow_nan=False) + "\n"


def _finite_or_null(value: object) -> object:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite_or_null(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite_or_null(v) for v in value]
    return value
