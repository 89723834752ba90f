"""The controller's side of the trainer boundary: start the trainer process(es) for a job.

    controller ─► run_dir/trainer_config.json (TrainerJob) ─► python -m areal.trainer --config it
                                                 (ranks > 1: torchrun, one process per rank)

The trainer runs as the leader of its own process group, dies with the controller, and logs to
``run_dir/trainer.log``; ``trainer.gpus`` becomes its ``CUDA_VISIBLE_DEVICES`` (rank i takes the
i-th listed GPU, as ``LOCAL_RANK`` i). Importing this module does not import torch.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from areal.process import die_with_parent
from areal.trainer.config import TrainerJob


def trainer_command(job_path: Path, ranks: int) -> list[str]:
    """``python -m areal.trainer`` for one rank; torchrun on a free loopback port for several."""
    if ranks == 1:
        return [sys.executable, "-m", "areal.trainer", "--config", str(job_path)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
    return [*torchrun, "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "areal.trainer", "--config", str(job_path)]


def start_trainer(job: TrainerJob, run_dir: Path) -> subprocess.Popen:
    """Write ``job`` as ``run_dir/trainer_config.json`` and start its ranks (one per ring)."""
    path = run_dir / "trainer_config.json"
    path.write_text(job.to_json())
    ranks = len(job.ring_names) or 1
    env = None
    if job.trainer.gpus:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ",".join(map(str, job.trainer.gpus))}
    with open(run_dir / "trainer.log", "ab") as log:
        return subprocess.Popen(
            trainer_command(path, ranks),
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
