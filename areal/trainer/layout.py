"""Where checkpoints live: ``<run_dir>/checkpoints/step-<8 digits>``, each complete once it has
its final name (checkpoint.py writes to a temporary name and renames). Read by the trainer when it
resumes and by the controller when it plans a resume; no torch here, so the controller can.
"""

from __future__ import annotations

from pathlib import Path

PREFIX = "step-"  # checkpoints/step-00000012


def checkpoint_dir(root: Path, step: int) -> Path:
    return root / f"{PREFIX}{step:08d}"


def latest_checkpoint(root: Path) -> Path | None:
    """The complete checkpoint with the highest step under ``root``, or None (a checkpoint
    exists under its final name only once complete: the rename is the commit point)."""
    if not root.is_dir():
        return None
    done = sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit())
    return done[-1] if done else None
