"""Where a run's numbers go: ``logger=[jsonl, console, wandb, tensorboard]``, one object for the controller.

    controller ──► Trackers ──┬─► JsonlTracker        metrics.jsonl (a line per step), evals.jsonl (a line per evaluation)
      log_step(row)           ├─► ConsoleTracker      a line per step and per evaluation on stdout
      log_eval(name, r, step) ├─► WandbTracker        a W&B run under <run_dir>/wandb/ (offline by default)
      offer_episode(row_fn)   └─► TensorboardTracker  event files under <run_dir>/tensorboard/ (tracker.tensorboard.path)
      close(ok)

What every backend gets (each in its own form):
- per-step scalars: every number of the step's ``metrics.jsonl`` line, ``lr`` included, at that step;
- evaluations: ``eval/<name>/<key>`` at the step they ran after (``before``: 0, ``after``: the last
  step; an evaluation during training: its step);
- episodes (W&B and TensorBoard): a table of a uniform sample of ``tracker.episodes_per_step``
  episodes among those that finished since the previous step (reservoir sampling; only the sampled
  ones are decoded), columns episode_id, status, reward, n_calls, prompt, calls, error;
  ``episodes.jsonl`` keeps every episode whatever the trackers;
- the resolved config: the W&B run's config, TensorBoard's text ``config`` (``config.json`` for all).

Sweeps: a W&B run's group is ``tracker.wandb.group``, else the sweep in a Hydra multirun
(``<experiment_name>/<sweep dir name>``, set by ``areal.train``), else ``experiment_name``; its name
is ``tracker.wandb.name``, else the run directory's name (a sweep's job number). TensorBoard files
live in each run's own directory, so ``tensorboard --logdir <sweep dir>`` shows a sweep's runs together.

Covered: W&B offline (no network: ``wandb sync <run_dir>/wandb/offline-run-*`` uploads it later) or
online when asked; TensorBoard through ``torch.utils.tensorboard``. A resumed run (areal/controller/recovery.py)
continues its W&B run: the id drawn at the first start is kept in ``<run_dir>/wandb_run_id``. Not
covered: SwanLab; AReaL's ``stats_logger.wandb.config`` and ``id_suffix`` (areal/api/areal_keys.py
names them).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math
import random
import secrets
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from tqdm import tqdm

from areal.jsonl import json_line

LOGGERS = ("jsonl", "console", "wandb", "tensorboard")
WANDB_MODES = ("offline", "online")
CELL_CHARS = 2000  # of one text cell of an episode table; its head is kept
CONSOLE_KEYS = ("reward_mean", "loss", "lr", "grad_norm", "approx_kl", "entropy", "step_s")


@dataclass
class WandbConfig:
    """``tracker.wandb``: the W&B run of ``logger=[..., wandb]`` (AReaL: ``stats_logger.wandb``)."""

    # offline: files under <run_dir>/wandb, no network (`wandb sync` uploads them); online: streamed (needs a login)
    mode: str = "offline"
    project: str = ""  # empty: experiment_name
    entity: str = ""  # empty: W&B's default entity
    name: str = ""  # empty: the run directory's name (a sweep's job number)
    group: str = ""  # empty: in a sweep <experiment_name>/<sweep dir name>, else experiment_name
    job_type: str = ""
    notes: str = ""
    tags: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.mode not in WANDB_MODES:
            raise ValueError(
                f"tracker.wandb.mode must be one of {WANDB_MODES}, got {self.mode!r} (leave wandb out of `logger` to disable it)"
            )
        if not isinstance(self.tags, list) or not all(isinstance(t, str) for t in self.tags):
            raise ValueError(f"tracker.wandb.tags must be a list of strings, got {self.tags!r}")


@dataclass
class TensorboardConfig:
    """``tracker.tensorboard`` (AReaL: ``stats_logger.tensorboard``)."""

    path: str = ""  # the event files' directory; empty: <run_dir>/tensorboard


@dataclass
class TrackerConfig:
    """``tracker``: settings of the trackers named by the top-level ``logger`` list."""

    episodes_per_step: int = 8  # episodes sampled into each step's table (wandb, tensorboard); 0: no tables
    wandb: WandbConfig = field(default_factory=WandbConfig)
    tensorboard: TensorboardConfig = field(default_factory=TensorboardConfig)

    def __post_init__(self) -> None:
        if isinstance(self.episodes_per_step, bool) or not isinstance(self.episodes_per_step, int) or self.episodes_per_step < 0:
            raise ValueError(f"tracker.episodes_per_step must be an integer >= 0, got {self.episodes_per_step!r}")


def check_loggers(names: list[str]) -> None:
    """Refuse a ``logger`` list that names an unknown tracker, or one twice."""
    if not isinstance(names, list) or any(n not in LOGGERS for n in names) or len(set(names)) != len(names):
        raise ValueError(f"logger must list distinct trackers among {list(LOGGERS)}, got {names!r}")


class Tracker(Protocol):
    tables: bool  # whether it shows episode tables (the sample is drawn only if one does)

    def log_step(self, step: int, row: dict[str, Any]) -> None: ...
    def log_eval(self, name: str, scalars: dict[str, float], step: int) -> None: ...
    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None: ...
    def close(self, ok: bool) -> None: ...


class Trackers:
    """The one object the controller calls; it fans each record out to the chosen backends."""

    def __init__(self, backends: list[Tracker], episodes_per_step: int, seed: int) -> None:
        self.backends = backends
        self.sample_size = episodes_per_step if any(b.tables for b in backends) else 0
        self._rng = random.Random(seed)
        self._sample: list[Callable[[], dict[str, Any]]] = []
        self._offered = 0

    def offer_episode(self, row: Callable[[], dict[str, Any]]) -> None:
        """One finished episode; ``row()`` builds its table row and is called only if it is
        sampled (reservoir sampling over the episodes since the last step)."""
        if not self.sample_size:
            return
        self._offered += 1
        if len(self._sample) < self.sample_size:
            self._sample.append(row)
        elif (j := self._rng.randrange(self._offered)) < self.sample_size:
            self._sample[j] = row

    def log_step(self, row: dict[str, Any]) -> None:
        """The step's metrics line (``row["step"]`` is the x axis), then its episode table."""
        step = int(row["step"])
        for b in self.backends:
            b.log_step(step, row)
        sample, self._sample, self._offered = self._sample, [], 0
        if sample:
            table = [_table_row(make()) for make in sample]
            for b in self.backends:
                if b.tables:
                    b.log_table("episodes", table, step)

    def log_eval(self, name: str, result: dict[str, Any], step: int) -> None:
        """An evaluation's numbers (``areal.controller.evaluation.evaluate``'s dict; lists are left out)."""
        scalars = {k: v for k, v in result.items() if _is_number(v)}
        for b in self.backends:
            b.log_eval(name, scalars, step)

    def close(self, ok: bool = True) -> None:
        """Flush and close every backend (each one, even if another fails); ``ok``: the run finished."""
        with contextlib.ExitStack() as stack:
            for b in self.backends:
                stack.callback(b.close, ok)


def open_trackers(
    names: list[str], config: TrackerConfig, run_dir: Path, experiment_name: str, resolved: dict[str, Any], seed: int
) -> Trackers:
    """The trackers ``names`` (the ``logger`` list) for the run in ``run_dir``; ``resolved`` is its config."""
    check_loggers(names)
    backends: list[Tracker] = []
    for name in names:
        if name == "jsonl":
            backends.append(JsonlTracker(run_dir))
        elif name == "console":
            backends.append(ConsoleTracker())
        elif name == "wandb":
            backends.append(WandbTracker(config.wandb, run_dir, experiment_name, resolved))
        elif name == "tensorboard":
            backends.append(TensorboardTracker(config.tensorboard, run_dir, resolved))
        else:
            raise ValueError(f"logger: unknown tracker {name!r}; choose among {list(LOGGERS)}")
    return Trackers(backends, config.episodes_per_step, seed)


class JsonlTracker:
    """``metrics.jsonl`` (a line per step) and ``evals.jsonl`` (a line per evaluation) in the run dir."""

    tables = False  # episodes.jsonl holds every episode already

    def __init__(self, run_dir: Path) -> None:
        self.metrics = open(run_dir / "metrics.jsonl", "a")
        self.evals_path = run_dir / "evals.jsonl"

    def log_step(self, step: int, row: dict[str, Any]) -> None:
        self.metrics.write(json_line(row))
        self.metrics.flush()

    def log_eval(self, name: str, scalars: dict[str, float], step: int) -> None:
        with open(self.evals_path, "a") as f:
            f.write(json_line({"name": name, "step": step, **scalars}))

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        raise AssertionError("JsonlTracker shows no tables")

    def close(self, ok: bool) -> None:
        self.metrics.close()


class ConsoleTracker:
    """A line per step (the main scalars and the episode counts) and per evaluation, above the progress bar."""

    tables = False

    def log_step(self, step: int, row: dict[str, Any]) -> None:
        parts = [f"step {step} (v{row.get('version')})"]
        parts += [f"{k} {row[k]:.4g}" for k in CONSOLE_KEYS if _is_number(row.get(k))]
        parts += [f"{k} {v}" for k, v in row.items() if k.startswith("episodes_")]
        parts += [f"{k} {v:.4g}" for k, v in row.items() if k.startswith("reward/")]  # per task (rows with a task)
        tqdm.write(" | ".join(parts))

    def log_eval(self, name: str, scalars: dict[str, float], step: int) -> None:
        tqdm.write(f"eval {name} (step {step}) | " + " | ".join(f"{k} {v:.4g}" for k, v in scalars.items()))

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        raise AssertionError("ConsoleTracker shows no tables")

    def close(self, ok: bool) -> None:
        return None


class WandbTracker:
    """A W&B run in ``<run_dir>/wandb/``: scalars and tables in its history, the config as its config."""

    tables = True

    def __init__(self, config: WandbConfig, run_dir: Path, experiment_name: str, resolved: dict[str, Any]) -> None:
        if importlib.util.find_spec("wandb") is None:
            raise ModuleNotFoundError("logger=[wandb] needs the wandb package: pip install 'areal-lite[tracking]'")
        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            mode=config.mode,
            dir=str(run_dir),
            project=config.project or experiment_name,
            entity=config.entity or None,
            name=config.name or run_dir.name,
            group=config.group or experiment_name,
            job_type=config.job_type or None,
            notes=config.notes or None,
            tags=config.tags or None,
            config=resolved,
            id=_run_id(run_dir),  # one W&B run per run dir: a resumed run continues its history
            resume="allow",
            reinit="create_new",  # one run per Controller, even when one process runs several
            # console off: the run's stdout is not W&B's to wrap (the zygote's pipes, tqdm)
            settings=wandb.Settings(console="off", silent=True),
        )
        tqdm.write(f"[tracker] W&B {config.mode} run in {Path(self.run.dir).parent}")

    def log_step(self, step: int, row: dict[str, Any]) -> None:
        self.run.log(_scalars(row), step=step)

    def log_eval(self, name: str, scalars: dict[str, float], step: int) -> None:
        self.run.log({f"eval/{name}/{k}": v for k, v in scalars.items()}, step=step)

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        columns = list(rows[0])
        self.run.log({name: self.wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])}, step=step)

    def close(self, ok: bool) -> None:
        self.run.finish(exit_code=0 if ok else 1)


class TensorboardTracker:
    """TensorBoard event files: a scalar per metric, the episode tables and the config as text."""

    tables = True

    def __init__(self, config: TensorboardConfig, run_dir: Path, resolved: dict[str, Any]) -> None:
        if importlib.util.find_spec("tensorboard") is None:
            raise ModuleNotFoundError("logger=[tensorboard] needs the tensorboard package: pip install 'areal-lite[tracking]'")
        from torch.utils.tensorboard import SummaryWriter

        self.path = Path(config.path) if config.path else run_dir / "tensorboard"
        self.writer = SummaryWriter(log_dir=str(self.path))
        # Markdown: an indented block is shown as code.
        self.writer.add_text("config", "\n".join("    " + line for line in json.dumps(resolved, indent=2).splitlines()), 0)

    def log_step(self, step: int, row: dict[str, Any]) -> None:
        for key, value in _scalars(row).items():
            self.writer.add_scalar(key, value, step)
        self.writer.flush()  # a step is minutes apart: show it now, not at the next 120 s flush

    def log_eval(self, name: str, scalars: dict[str, float], step: int) -> None:
        for key, value in scalars.items():
            self.writer.add_scalar(f"eval/{name}/{key}", value, step)
        self.writer.flush()

    def log_table(self, name: str, rows: list[dict[str, Any]], step: int) -> None:
        columns = list(rows[0])
        lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
        lines += ["| " + " | ".join(_markdown_cell(r[c]) for c in columns) + " |" for r in rows]
        self.writer.add_text(name, "\n".join(lines), step)

    def close(self, ok: bool) -> None:
        self.writer.close()


def _run_id(run_dir: Path) -> str:
    """The W&B run id of ``run_dir``: drawn at its first start and kept in ``wandb_run_id``."""
    path = run_dir / "wandb_run_id"
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    run_id = secrets.token_hex(4)  # W&B's ids: letters and digits
    path.write_text(run_id)
    return run_id


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _scalars(row: dict[str, Any]) -> dict[str, float]:
    """The numbers of a metrics line, less its axis (``step``) and wall-clock ``time`` (both trackers keep their own)."""
    return {k: float(v) for k, v in row.items() if _is_number(v) and k not in ("step", "time")}


def _table_row(row: dict[str, Any]) -> dict[str, Any]:
    """Text cells cut to CELL_CHARS (an episode's prompt or reply may be any size); non-finite rewards as None."""
    out: dict[str, Any] = {}
    for key, value in row.items():
        if isinstance(value, str) and len(value) > CELL_CHARS:
            value = f"{value[:CELL_CHARS]}... ({len(value) - CELL_CHARS} more characters)"
        elif isinstance(value, float) and not math.isfinite(value):
            value = None
        out[key] = value
    return out


def _markdown_cell(value: Any) -> str:
    return str(value).replace("|", "\\|").replace("\n", "<br>")
