"""areal-lite. ``from areal import PPOTrainer, workflow_context`` as in AReaL (loaded on first use)."""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "PPOTrainer":
        from areal.experimental.trainer import PPOTrainer

        return PPOTrainer
    raise AttributeError(f"module 'areal' has no attribute {name!r}")
