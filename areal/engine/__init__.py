"""Inference engines behind SGLang's native HTTP API.

``client`` (no torch import): ``EngineClient`` for any SGLang-protocol server, typed errors and
``request_json``, the one blocking request to an engine. ``interface``: what every engine client
implements (``InferenceEngine``, ``WeightUpdatable``). ``launch``: every server started as a
subprocess (``launch_embedded_engine``, ``launch_command``, ``EngineProcess``, ``free_port``).
``server``: the embedded CPU engine (``python -m areal.engine.server``; compute in ``batch`` and
``model``, sampling in ``sampling``), imported only by the process that serves the model.
``router``: ``EngineRouter`` over several servers (sticky sessions, failover). ``vllm``:
``VLLMClient`` over vLLM's own routes. ``fleet``: the servers a run launched, watched and
restarted. ``serving``: a run's engines by ``engine.kind``, launched or reached, behind one client
(``start_engines``). Loading a weights version from disk, on either protocol, is
``areal.weights.disk``.
"""

from areal.engine.client import EngineClient, EngineError, EngineUnavailable, GenerateResult
from areal.engine.launch import EngineProcess, launch_embedded_engine
from areal.engine.router import EngineRouter

__all__ = [
    "EngineClient",
    "EngineError",
    "EngineRouter",
    "EngineProcess",
    "EngineUnavailable",
    "GenerateResult",
    "launch_embedded_engine",
]
