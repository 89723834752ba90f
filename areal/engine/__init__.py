"""Inference engines behind SGLang's native HTTP API.

``client`` (no torch import): ``EngineClient`` for any SGLang-protocol server, typed errors, the
sync weight-update helper and ``launch_embedded_engine``. ``server``: the embedded CPU engine
(``python -m areal.engine.server``; compute in ``batch``, sampling in ``sampling``), imported only
by the process that serves the model. ``router``: ``EngineRouter`` over several servers (sticky
sessions, failover) and ``launch_sglang_server``. ``vllm``: ``VLLMClient`` over vLLM's own routes.
``fleet``: the servers a run launched, watched and restarted. ``serving``: a run's engines by
``engine.kind``, launched or reached, behind one client (``start_engines``).
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
from areal.engine.router import EngineRouter, launch_sglang_server

__all__ = [
    "EngineClient",
    "EngineError",
    "EngineRouter",
    "EngineProcess",
    "EngineUnavailable",
    "GenerateResult",
    "launch_embedded_engine",
    "launch_sglang_server",
    "update_weights_from_disk_sync",
]
