"""``make_job(**fields)``: a TrainerJob from one flat set of keywords (wiring and trainer fields mixed)."""

from __future__ import annotations

import dataclasses
from typing import Any

from areal.trainer.config import TrainerConfig, TrainerJob

_JOB_FIELDS = {f.name for f in dataclasses.fields(TrainerJob)} - {"trainer"}


def make_job(**fields: Any) -> TrainerJob:
    job = {k: v for k, v in fields.items() if k in _JOB_FIELDS}
    return TrainerJob(**job, trainer=TrainerConfig(**{k: v for k, v in fields.items() if k not in _JOB_FIELDS}))
