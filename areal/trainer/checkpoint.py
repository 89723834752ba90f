"""Atomic trainer checkpoints: model, optimizer, schedule, RNG, step/version and each rank's data position.

Layout (one directory per checkpoint; it exists under its final name only once complete)::

    run_dir/checkpoints/
      .tmp-step-00000012/      being written (a crash leaves it behind; the next save removes it)
      step-00000012/           renamed from .tmp-* after every file below is written
        meta.json              {"step", "version", "world_size", "model_shape"} (model_shape: trainer.lora)
        state/                 model + optimizer, torch.distributed.checkpoint format (every rank
                               writes its shards; DTensor shards under FSDP2, one copy of replicated
                               DDP tensors); keys are parameter names, so any rank count loads it
        scheduler.pt           learning-rate schedule state (rank 0; every rank loads it)
        rng-r{rank}.pt         torch CPU RNG state          (every rank)
        data-r{rank}.msgpack   DataPosition                 (every rank: its own ring)

Write protocol with several ranks: rank 0 creates the temp dir; barrier; every rank writes its
own files and its shards (``dcp.save`` is itself a collective); barrier; rank 0 writes meta and
renames; barrier. Only after the last barrier may a rank tell its ring that the records up to
``last_seq`` are consumed, so a record is either in a complete checkpoint (trained, or held in
``held``) or still in the ring.

Two ways to load (``load_checkpoint(positions=...)``):
- the trainer alone restarted on the same rings (``--resume``): everything, the ring positions
  included, so the world size must be the one that wrote it;
- a whole run resumed (areal/controller/recovery.py): model, optimizer, schedule and step only; the
  controller replays the records no checkpoint holds into new rings, so the world size may
  differ (a rank with no RNG file of its own keeps its seeded generator).

Invariants:
- ``latest_checkpoint`` only ever returns a complete checkpoint (the rename is the commit point).
- A resumed run continues from ``step``: trained episodes of later steps were lost with the
  process and are trained again.
- Small files are read with ``torch.load(weights_only=True)``: no arbitrary pickle is executed.

Not covered: a torn write of the storage itself (no fsync: SIGKILL is covered, power loss is not).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path

import msgspec
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from areal.trainer.layout import PREFIX, checkpoint_dir, latest_checkpoint

__all__ = ["PREFIX", "DataPosition", "checkpoint_dir", "latest_checkpoint", "load_checkpoint", "save_checkpoint"]


class DataPosition(msgspec.Struct):
    """Where one rank stands in its ring when the checkpoint was taken."""

    consumed: int  # records read from the ring so far (including held ones)
    last_seq: int  # sequence number of the last record read (-1: none yet)
    held: list[bytes] = []  # encoded records read but not yet trained (incomplete groups), in ring order


def save_checkpoint(
    root: Path,
    step: int,
    version: int,
    rank: int,
    world: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    position: DataPosition,
    barrier: Callable[[], None],
    keep: int = 2,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    model_shape: dict | None = None,
) -> Path:
    """Write checkpoint ``step`` (every rank calls this: the state is saved collectively); returns
    its final directory. ``model`` and ``optimizer`` are the trained module and its optimizer
    (sharded or not)."""
    final = checkpoint_dir(root, step)
    tmp = root / f".tmp-{final.name}"
    if rank == 0:
        root.mkdir(parents=True, exist_ok=True)
        for stale in (tmp, final):  # leftovers of a crash, or a step redone after a resume
            if stale.exists():
                shutil.rmtree(stale)
        tmp.mkdir()
    barrier()
    torch.save(torch.get_rng_state(), tmp / f"rng-r{rank}.pt")
    (tmp / f"data-r{rank}.msgpack").write_bytes(msgspec.msgpack.encode(position))
    model_state, optim_state = get_state_dict(model, optimizer)
    with _one_process_quiet():
        dcp.save({"model": model_state, "optim": optim_state}, checkpoint_id=tmp / "state", no_dist=not _distributed())
    barrier()
    if rank == 0:
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        meta = {"step": step, "version": version, "world_size": world, "model_shape": model_shape or {}}
        (tmp / "meta.json").write_text(json.dumps(meta))
        os.rename(tmp, final)
        for old in sorted(p for p in root.iterdir() if p.name.startswith(PREFIX))[:-keep]:
            shutil.rmtree(old)
    barrier()
    return final


def load_checkpoint(
    path: Path,
    rank: int,
    world: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    positions: bool = True,
    model_shape: dict | None = None,
) -> tuple[dict, DataPosition | None]:
    """Restore model, optimizer, learning-rate schedule and RNG in place (every rank calls this);
    return (meta, this rank's DataPosition, or None with ``positions=False``). The schedule loads
    after the optimizer, so both agree on the rate. With ``positions`` the world size must be the
    one that wrote the checkpoint (each rank's ring position is its own); without, any."""
    meta = json.loads((path / "meta.json").read_text())
    if positions and meta["world_size"] != world:
        raise ValueError(
            f"checkpoint {path} was written by {meta['world_size']} ranks; resuming the trainer alone on the same rings "
            f"with {world} is not possible (each rank's ring position is its own): resume the whole run instead "
            "(the same command again, recover.mode=auto), which replays the records into new rings at any rank count"
        )
    saved = meta.get("model_shape", {})
    if model_shape is not None and saved != model_shape:  # e.g. trainer.lora changed: other parameter names
        raise ValueError(
            f"checkpoint {path} holds a model trained with {saved or 'no recorded settings'}, this run's is {model_shape}: "
            "resume with the settings it was written with (trainer.lora), or start a new run"
        )
    model_state, optim_state = get_state_dict(model, optimizer)
    state = {"model": model_state, "optim": optim_state}
    with _one_process_quiet():
        dcp.load(state, checkpoint_id=path / "state", no_dist=not _distributed())
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    if (path / f"rng-r{rank}.pt").is_file():
        torch.set_rng_state(torch.load(path / f"rng-r{rank}.pt", weights_only=True))
    if not positions:
        return meta, None
    position = msgspec.msgpack.decode((path / f"data-r{rank}.msgpack").read_bytes(), type=DataPosition)
    return meta, position


def _distributed() -> bool:
    """Whether the ranks form a process group (one DDP rank has none: its checkpoint is one process's)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


@contextlib.contextmanager
def _one_process_quiet() -> Iterator[None]:
    """torch.distributed.checkpoint warns on every save and load of a single process that it
    assumes a single process; that is what one rank without a group is."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled", category=UserWarning)
        yield
