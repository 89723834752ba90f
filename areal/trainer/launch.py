"""The controller's side of the trainer boundary: start the trainer process(es) for a job.

    controller ─► run_dir/trainer_config.json (TrainerJob) ─► python -m areal.trainer --config it
                                                 (ranks > 1: torchrun, one process per rank)

One CPU rank is forked by the run's fork server when it has one (areal/forkserver.py: torch and the
trainer's modules already imported), else started as a new interpreter; both give a ``Popen``-like handle.
The trainer runs as the leader of its own process group, dies with the controller, and logs to
``run_dir/trainer.log``; ``trainer.gpus`` becomes its ``CUDA_VISIBLE_DEVICES`` (rank i takes the
i-th listed GPU, as ``LOCAL_RANK`` i). Importing this module does not import torch.

On several nodes (``cluster.trainer_nodes``, areal/cluster/ray_trainer.py) each node starts its
own torchrun with a ``Rendezvous``: ``--nnodes N --node-rank i`` and node 0's address and port,
torchrun's static rendezvous, so global rank = node rank x ranks per node + local rank. Node i > 0
writes ``trainer_config-node{i}.json`` and ``trainer-node{i}.log`` (node 0 keeps the one-host
names): the run directory is shared, and two nodes must not rewrite one file a rank is reading.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from areal import forkserver
from areal.process import die_with_parent
from areal.trainer.config import TrainerJob


@dataclass(frozen=True)
class Rendezvous:
    """Where the torchruns of several nodes meet: node 0's address and port, and this node's place."""

    master_addr: str  # node 0's IP: torchrun's static rendezvous store listens there
    master_port: int
    nnodes: int
    node_rank: int
    node_addr: str  # this node's IP: gloo's sockets go out on the interface that holds it


def trainer_command(job_path: Path, ranks: int, rendezvous: Rendezvous | None = None) -> list[str]:
    """``python -m areal.trainer`` for one rank; torchrun on a free loopback port for several;
    with a ``rendezvous``, torchrun for this node's ``ranks`` of ``nnodes`` nodes."""
    if rendezvous is not None:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(rendezvous.nnodes), "--node-rank"]
        torchrun += [str(rendezvous.node_rank), "--nproc-per-node", str(ranks), "--master-addr", rendezvous.master_addr]
        return [*torchrun, "--master-port", str(rendezvous.master_port), "-m", "areal.trainer", "--config", str(job_path)]
    if ranks == 1:
        return [sys.executable, "-m", "areal.trainer", "--config", str(job_path)]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(ranks)]
    return [*torchrun, "--master-addr", "127.0.0.1", "--master-port", str(port), "-m", "areal.trainer", "--config", str(job_path)]


def interface_of(ip: str) -> str:
    """The network interface holding IPv4 address ``ip`` (Linux), or "" when none does."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR: the interface's IPv4 address
                packed = fcntl.ioctl(s.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:  # the interface has no IPv4 address
                continue
            if socket.inet_ntoa(packed[20:24]) == ip:
                return name
    return ""


def trainer_log(run_dir: Path, node_rank: int = 0) -> Path:
    """The log of node ``node_rank``'s trainer processes (node 0: the one-host name)."""
    return run_dir / (f"trainer-node{node_rank}.log" if node_rank else "trainer.log")


def start_trainer(
    job: TrainerJob, run_dir: Path, rendezvous: Rendezvous | None = None, env: dict[str, str] | None = None
) -> subprocess.Popen | forkserver.ForkedProcess:
    """Write ``job`` as ``run_dir/trainer_config.json`` and start its ranks (one per ring); with a
    ``rendezvous``, this node's share of them. ``env``: added to the ranks' environment (not the
    file: the run's CURVE keys, areal/curve.py)."""
    node_rank = rendezvous.node_rank if rendezvous is not None else 0
    path = run_dir / (f"trainer_config-node{node_rank}.json" if node_rank else "trainer_config.json")
    path.write_text(job.to_json())
    ranks = (len(job.ring_names) or 1) // (rendezvous.nnodes if rendezvous is not None else 1)
    added = dict(env or {})
    if job.trainer.gpus:
        added["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, job.trainer.gpus))
    if rendezvous is not None and "GLOO_SOCKET_IFNAME" not in os.environ:
        # gloo otherwise takes the address the hostname resolves to, often 127.0.1.1: unreachable from other nodes
        ifname = interface_of(rendezvous.node_addr)
        if ifname:
            added["GLOO_SOCKET_IFNAME"] = ifname
    cmd = trainer_command(path, ranks, rendezvous)
    server = forkserver.current()
    if server is not None and cmd[1:3] == ["-m", "areal.trainer"] and not job.trainer.gpus:  # one CPU rank
        return server.spawn("areal.trainer", cmd[3:], str(trainer_log(run_dir, node_rank)), env={**os.environ, **added})
    with open(trainer_log(run_dir, node_rank), "ab") as log:
        return subprocess.Popen(
            cmd,
            env={**os.environ, **added} if added else None,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
