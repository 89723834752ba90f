"""The trainer: one process per rank, reading trajectories from its ring and publishing weights.

    config.py       TrainerConfig (the run's `trainer:` section) and TrainerJob (one process's wiring)
    launch.py       the controller's side: start the process(es) for a job (torchrun for several ranks)
    rank.py         the process: main(), train() — ring → steps → checkpoints → published versions
    step.py         one optimizer step: complete groups, advantages, micro-batches, the loss
    loss.py         advantages and policy losses (GRPO, decoupled PPO, KL estimators)
    packing.py      rows → packed micro-batches; PolicyScorer (logprobs, lm head in chunks, attention row by row)
    reports.py      the report socket, both ends: Reporter (ranks, PUSH) and trainer_messages (controller, PULL)
    checkpoint.py   atomic checkpoints and the ring position they hold
    layout.py       where checkpoints live (no torch: the controller reads it to plan a resume)
    fsdp.py         FSDP2 sharding per decoder layer, full-weight gathers

Run as ``python -m areal.trainer --config <run_dir>/trainer_config.json`` (the controller does);
importing this package (or ``config``) does not import torch. Saving a version and pushing it
to the engines is areal/weights/ (``disk.py``: save atomically, push, prune; ``collective.py``:
the broadcast), each with the engine's end of it.

``from areal.trainer import PPOTrainer`` is AReaL's import path for its trainer entry: the one
name served lazily (the AReaL layer, ``areal.experimental.trainer``), so the rank process never
loads it.
"""

from typing import Any


def __getattr__(name: str) -> Any:
    if name == "PPOTrainer":
        from areal.experimental.trainer import PPOTrainer

        return PPOTrainer
    raise AttributeError(f"module 'areal.trainer' has no attribute {name!r}")
