"""AReaL's ``areal.utils.logging.getLogger(name, type_, level)``: a stdlib logger writing to stderr.

``from areal.utils import logging; logger = logging.getLogger("CountDown")`` as in AReaL's
examples. Each named logger gets one stderr handler in AReaL's format (time, name, level) and does
not propagate, so a message is printed once; ``type_`` ("plain", "colored", "benchmark",
"system") is accepted and all print plainly.
"""

from __future__ import annotations

import logging
import sys

LOGLEVEL = logging.INFO
_TYPES = ("plain", "benchmark", "colored", "system")
_FORMAT = "%(asctime)s.%(msecs)03d %(name)s %(levelname)s: %(message)s"


def getLogger(name: str | None = None, type_: str | None = None, level: int = LOGLEVEL) -> logging.Logger:  # noqa: N802 - AReaL's name
    """The logger ``name`` ("plain" when None), with its stderr handler."""
    if type_ is not None and type_ not in _TYPES:
        raise ValueError(f"type_ must be one of {', '.join(_TYPES)}, got {type_!r}")
    logger = logging.getLogger(name or "plain")
    if not any(getattr(h, "_areal", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter(_FORMAT, datefmt="%Y%m%d-%H:%M:%S"))
        handler._areal = True  # type: ignore[attr-defined]  -- marks the handler this function added
        logger.addHandler(handler)
        logger.propagate = False
    logger.setLevel(level)
    return logger
