"""What a run settles before and around its loop, each from the settings it uses (the controller,
``areal/controller/loop.py``, calls these once per run):

    run_dir ─► plan_continuation: a fresh directory; a killed run continued (recover.mode=auto,
               its records cut back to the checkpoint); else RunFailed naming what to do
    model.path ─► hf_model_dir: the HF directory the engines serve and the trainer starts from
    gateway + the model's max_position_embeddings ─► gateway_config: the limits the gateway enforces
      (both live beside their parts, areal/embedded/resolve.py and areal/gateway/families.py, which
      ``python -m areal.gateway`` shares; imported here as the run's)
    sandbox + run_dir ─► sandbox_config: the run's own files masked in every episode's root
    a resumed run ─► load_resumed_weights: every engine on the checkpoint's weights before any rollout

``RunFailed`` is the run's one error: it could not continue, and the message names the component
and the reason.
"""

from __future__ import annotations

import asyncio
import dataclasses
import subprocess
from collections.abc import Callable
from pathlib import Path

from areal.controller.recovery import Resume, holds_run, plan_resume, prepare_records
from areal.embedded.resolve import hf_model_dir as hf_model_dir
from areal.engine.serving import weight_loader
from areal.gateway.families import gateway_config as gateway_config
from areal.process import log_tail
from sandbox.isolation import SandboxConfig


class RunFailed(RuntimeError):
    """The run could not continue; the message names the component and the reason."""


def check_fresh_run_dir(run_dir: Path) -> None:
    """A run directory holds one run: refuse one that already holds a run's records (a rerun
    into it would append a second run's steps and episodes to the first's)."""
    held = {
        name: sum(1 for _ in open(run_dir / name))
        for name in ("metrics.jsonl", "episodes.jsonl")
        if (run_dir / name).is_file() and (run_dir / name).stat().st_size
    }
    if held:
        what = ", ".join(f"{name} with {n} lines" for name, n in held.items())
        raise RunFailed(
            f"run directory {run_dir} already holds a run ({what}); a run directory holds one run: "
            "choose another (hydra.run.dir=...) or remove it, or continue it from its last checkpoint with recover.mode=auto"
        )


def plan_continuation(recover_mode: str, n_samples: int, run_dir: Path, write: Callable[[str], None]) -> Resume | None:
    """What a run in ``run_dir`` continues from: None for a fresh directory; the killed run's
    plan with ``recover_mode`` auto (its records are cut back to the checkpoint; ``n_samples``:
    rollout.n_samples, a group's size); otherwise, or for a finished run, a ``RunFailed`` naming
    what to do."""
    if not holds_run(run_dir):
        return None
    if recover_mode != "auto":
        check_fresh_run_dir(run_dir)
        return None
    if (run_dir / "summary.json").is_file():
        raise RunFailed(
            f"run directory {run_dir} holds a finished run (summary.json); a run directory holds one run: "
            "choose another (hydra.run.dir=...) or remove it"
        )
    plan = plan_resume(run_dir, n_samples)
    prepare_records(run_dir, plan)
    write(f"[resume] {run_dir}: {plan.describe()}")
    return plan


def sandbox_config(sandbox: SandboxConfig, run_dir: Path) -> SandboxConfig:
    """``sandbox``, with the run's directory masked in every episode's root, and the top-level
    directory holding it when that lies in the working directory (``runs/`` with Hydra's default
    layout): other runs' checkpoints and logs are not the agent's."""
    run_dir, cwd = run_dir.resolve(), Path.cwd().resolve()
    hide = [str(run_dir)]
    if run_dir.is_relative_to(cwd) and run_dir != cwd:
        hide.append(str(cwd / run_dir.relative_to(cwd).parts[0]))
    return dataclasses.replace(sandbox, hide=[*sandbox.hide, *hide])


async def load_resumed_weights(
    run_dir: Path, step: int, urls: list[str], trainer: subprocess.Popen, engine_kind: str, timeout_s: float, write: Callable[[str], None]
) -> None:
    """Have every engine (at ``urls``, of ``engine_kind``) serve the weights of checkpoint ``step``
    as that version before any rollout: the ``trainer``, resumed, writes ``weights/v<step>``
    first when the killed run had not published it. ``timeout_s``: trainer.engine_timeout_s."""
    path = run_dir / "weights" / f"v{step}"
    while not (path / "config.json").is_file():
        if trainer.poll() is not None:
            raise RunFailed(
                f"the trainer exited (code {trainer.returncode}) before writing the weights of checkpoint step {step}; "
                f"log tail:\n{log_tail(run_dir / 'trainer.log') or '(empty log)'}"
            )
        await asyncio.sleep(0.2)
    load = weight_loader(engine_kind)
    await asyncio.gather(*(asyncio.to_thread(load, url, str(path), str(step), timeout_s=timeout_s) for url in urls))
    write(f"[resume] the engines serve version {step}, the checkpoint's weights")
