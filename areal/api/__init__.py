"""AReaL's ``areal.api`` import paths: ``cli_args``, ``engine_api``, ``io_struct``, ``reward_api``,
``workflow_api``.

``from areal.api import AsyncRewardWrapper, RolloutWorkflow, AgentWorkflow, InferenceEngine,
ModelRequest, ModelResponse`` works too; the
names load on first use, so importing one submodule (inside a sandboxed agent) stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AsyncRewardWrapper": "reward_api",
    "RolloutWorkflow": "workflow_api",
    "AgentWorkflow": "workflow_api",
    "InferenceEngine": "engine_api",
    "ModelRequest": "io_struct",
    "ModelResponse": "io_struct",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'areal.api' has no attribute {name!r}")
    return getattr(importlib.import_module(f"areal.api.{_EXPORTS[name]}"), name)
