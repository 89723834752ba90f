"""Atomic trainer checkpoints: model, optimizer, RNG, step/version and each rank's data position.

Layout (one directory per checkpoint; it exists under its final name only once complete)::

    run_dir/checkpoints/
      .tmp-step-00000012/      being written (a crash leaves it behind; the next save removes it)
      step-00000012/           renamed from .tmp-* after every file below is written
        meta.json              {"step", "version", "world_size"}
        model.pt               model state_dict            (rank 0; every rank holds the same)
        optimizer.pt           optimizer state_dict        (rank 0)
        scheduler.pt           learning-rate schedule state (rank 0; every rank loads it)
        rng-r{rank}.pt         torch CPU RNG state          (every rank)
        data-r{rank}.msgpack   DataPosition                 (every rank: its own ring)

Write protocol with several ranks: rank 0 creates the temp dir; barrier; every rank writes its
own files; barrier; rank 0 writes model/optimizer/meta and renames; barrier. Only after the last
barrier may a rank tell its ring that the records up to ``last_seq`` are consumed, so a record
is either in a complete checkpoint (trained, or held in ``held``) or still in the ring.

Invariants:
- ``latest_checkpoint`` only ever returns a complete checkpoint (the rename is the commit point).
- A resumed run continues from ``step``: trained episodes of later steps were lost with the
  process and are trained again from the ring (records with ``seq <= last_seq`` are skipped).
- Files are read with ``torch.load(weights_only=True)``: no arbitrary pickle is executed.

Not covered: resuming with a different world size (the data positions are per ring); a torn
write of the storage itself (no fsync: SIGKILL is covered, power loss is not).
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

import msgspec
import torch

PREFIX = "step-"


class DataPosition(msgspec.Struct):
    """Where one rank stands in its ring when the checkpoint was taken."""

    consumed: int  # records read from the ring so far (including held ones)
    last_seq: int  # sequence number of the last record read (-1: none yet)
    held: list[bytes] = []  # encoded records read but not yet trained (incomplete groups), in ring order


def checkpoint_dir(root: Path, step: int) -> Path:
    return root / f"{PREFIX}{step:08d}"


def latest_checkpoint(root: Path) -> Path | None:
    """The complete checkpoint with the highest step under ``root``, or None."""
    if not root.is_dir():
        return None
    done = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit())
    return done[-1] if done else None


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
) -> Path:
    """Write checkpoint ``step`` (every rank calls this); returns its final directory."""
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
    barrier()
    if rank == 0:
        torch.save(model.state_dict(), tmp / "model.pt")
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        if scheduler is not None:
            torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        (tmp / "meta.json").write_text(json.dumps({"step": step, "version": version, "world_size": world}))
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
) -> tuple[dict, DataPosition]:
    """Restore model, optimizer, learning-rate schedule and RNG in place; return (meta, this
    rank's DataPosition). The schedule loads after the optimizer, so both agree on the rate."""
    meta = json.loads((path / "meta.json").read_text())
    if meta["world_size"] != world:
        raise ValueError(
            f"checkpoint {path} was written by {meta['world_size']} ranks; resuming with {world} "
            "is not supported (each rank's ring position is its own)"
        )
    model.load_state_dict(torch.load(path / "model.pt", weights_only=True))
    optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    if scheduler is not None:
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    torch.set_rng_state(torch.load(path / f"rng-r{rank}.pt", weights_only=True))
    position = msgspec.msgpack.decode((path / f"data-r{rank}.msgpack").read_bytes(), type=DataPosition)
    return meta, position
