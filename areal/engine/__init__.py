"""Inference engines behind SGLang's native HTTP API.

``client`` (no torch import): ``EngineClient`` for any SGLang-protocol server, typed errors, the
sync weight-update helper and ``launch_embedded_engine``. ``server``: the embedded CPU engine
(``python -m areal.engine.server``), imported only by the process that serves the model.
"""

from areal.engine.client import (
    EngineClient,
    EngineError,
    EngineProcess,
    EngineUnavailable,
    GenerateResult,
    launch_embedded_engine,
    update_weights_from_disk_sync,
)

__all__ = [
    "EngineClient",
    "EngineError",
    "EngineProcess",
    "EngineUnavailable",
    "GenerateResult",
    "launch_embedded_engine",
    "update_weights_from_disk_sync",
]
