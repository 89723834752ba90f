"""``cluster.kind=ray``: the trainer on a node of a Ray cluster, its rings there, fed over TCP.

    controller (this host, one process)                trainer node (a placement-group bundle)
      _publish ─► RemoteRing.put_trajectory            TrainerHost (a Ray actor)
                  TrajectorySender ──── tcp ────────►    TrajectoryReceiver ─► RingWriter (node /dev/shm)
                                                         start_trainer: python -m areal.trainer (torchrun)
      PULL tcp://<controller ip>:<port> ◄─── TrainerReport / Done / Failed ───┘  reads the rings
      RemoteTrainer.poll() ◄── ray.wait(host.wait) ── the trainer's exit code

The controller does not change: a ``RemoteRing`` has the surface of a ``RingWriter`` that
``_publish`` uses (``name``, ``put_trajectory(traj, timeout)``, ``close``), and a
``RemoteTrainer`` the ``poll``/``returncode`` of a ``Popen``. The hop is ``areal/ring/remote.py``:
sequence numbers, digests and exactly-once commit into the node's ring. Control calls to the actor
carry strings (the job as JSON), never our records.

Ray is imported here only: ``cluster.kind=local`` needs no Ray. ``ray.init`` joins
``cluster.address`` (or starts Ray on this host, or uses the Ray this process already runs in,
e.g. a job of the Ray sweep launcher); teardown (``close``) stops the trainer's process group,
the receivers and rings on the node, then the actor and the placement group, and shuts Ray down
if this run started it. The actor is owned by the controller: Ray ends it if the controller dies,
and the trainer dies with the actor (``die_with_parent``).

What is covered: the trainer (all its ranks, one node, one bundle) placed by resources, GPU or
custom; trajectories, reports and the exit code across nodes. Sandboxed rollout workers on other
nodes are ``areal/cluster/ray_rollout.py`` (``cluster.rollout_workers``; the gateway stays in the
controller, which still writes these rings). What is not covered: a gateway and trajectory sender
per rollout worker, engines placed by Ray (they run where the controller runs, or at
``engine.urls``), trainer ranks across several nodes, the trainer node's death (it fails the run;
resume it with ``recover.mode=auto``; a lost rollout worker is survived, see ray_rollout.py).
Requirements: the run directory and the model on storage every node sees at the same path (the
trainer writes checkpoints and ``weights/v*`` there, engines load them from there), engine URLs the
trainer node can reach, and the controller on a node of the cluster (not Ray Client).
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import ray
import zmq
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from areal.cluster.config import ClusterConfig
from areal.process import stop_group
from areal.protocol import Trajectory
from areal.ring.buffer import RingWriter, ring_name
from areal.ring.remote import TrajectoryReceiver, TrajectorySender
from areal.trainer.config import TrainerJob
from areal.trainer.launch import start_trainer


class TrainerHost:
    """On the trainer's node: one ring per rank, a receiver writing into each, the trainer process."""

    def __init__(self, ring_names: list[str], capacity_bytes: int) -> None:
        ip = ray.util.get_node_ip_address()
        self.rings = [RingWriter(name, capacity_bytes) for name in ring_names]
        self.receivers = [TrajectoryReceiver(f"tcp://{ip}:0", ring).start() for ring in self.rings]
        self.proc: subprocess.Popen | None = None

    def addresses(self) -> list[str]:
        return [r.address for r in self.receivers]

    def node(self) -> tuple[str, str]:
        """(node id, node ip) of this host: where the trainer runs."""
        return ray.get_runtime_context().get_node_id(), ray.util.get_node_ip_address()

    def start(self, job_json: str) -> int:
        """Start the trainer of ``job_json`` (a ``TrainerJob``); returns its pid on this node."""
        job = TrainerJob.from_json(job_json)
        self.proc = start_trainer(job, Path(job.run_dir))
        return self.proc.pid

    def wait(self) -> int:
        """Block until the trainer exits; its exit code (runs on one of the actor's threads)."""
        assert self.proc is not None
        return self.proc.wait()

    def stop(self) -> dict[str, int]:
        """Stop the trainer (its process group), the receivers and the rings (unlinked); the
        receivers' counts, for the controller's log."""
        if self.proc is not None:
            stop_group(self.proc, 5.0)
        counts = {"written": 0, "duplicates": 0, "refused": 0, "dropped": 0}
        for r in self.receivers:
            r.close()
            for k in counts:
                counts[k] += getattr(r, k)
        for ring in self.rings:
            ring.close(unlink=True)
        return counts


class RemoteRing:
    """A trainer rank's ring on another node, as ``_publish`` sees a ``RingWriter``."""

    def __init__(self, name: str, addr: str, window: int) -> None:
        self.name = name
        self.sender = TrajectorySender(addr, window=window)

    def put_trajectory(self, traj: Trajectory, timeout_s: float | None = None) -> None:
        self.sender.put(traj, timeout_s)  # kept until the node's ring holds it; resent after a reconnection

    def close(self, unlink: bool = False, timeout_s: float = 0) -> None:
        self.sender.close(timeout_s=timeout_s)


class RemoteTrainer:
    """The trainer process on the node, as the controller sees a ``Popen``: ``poll``, ``returncode``."""

    def __init__(self, host: ray.actor.ActorHandle, pid: int) -> None:
        self.pid = pid  # on the trainer's node
        self.returncode: int | None = None
        self.error = ""  # set when the actor or its node died instead
        self._exit = host.wait.remote()

    def poll(self) -> int | None:
        if self.returncode is None and ray.wait([self._exit], timeout=0)[0]:
            try:
                self.returncode = ray.get(self._exit)
            except ray.exceptions.RayError as e:  # the node or the actor died: the trainer with it
                self.returncode, self.error = -1, str(e)
        return self.returncode


class RayTrainerPlacement:
    """The trainer of one run placed on a Ray node; ``place`` builds it, ``close`` tears it down."""

    def __init__(self, config: ClusterConfig, started_ray: bool, pg: object, host: ray.actor.ActorHandle, rings: list[RemoteRing]) -> None:
        self.config, self.started_ray, self.pg, self.host, self.rings = config, started_ray, pg, host, rings
        self.node_id, self.node_ip = ray.get(host.node.remote())
        self.trainer: RemoteTrainer | None = None
        self.counts: dict[str, int] = {}

    @classmethod
    def place(cls, config: ClusterConfig, run_id: str, ranks: int, capacity_bytes: int) -> RayTrainerPlacement:
        """Join (or start) Ray, reserve the trainer's bundle, start its host there with one ring and
        receiver per rank, and connect a sender to each. Blocks up to ``placement_timeout_s``."""
        started_ray = not ray.is_initialized()
        if started_ray:
            ray.init(address=config.address or None, include_dashboard=False, log_to_driver=False)
        pg = host = None
        try:
            res = dict(config.trainer_resources)
            pg = placement_group([res], strategy="STRICT_PACK", name=f"areal-trainer-{run_id}")
            ready, _ = ray.wait([pg.ready()], timeout=config.placement_timeout_s)
            if not ready:
                raise TimeoutError(
                    f"cluster.trainer_resources={res}: no node of the Ray cluster had them free within "
                    f"cluster.placement_timeout_s={config.placement_timeout_s}s (cluster: {ray.cluster_resources()})"
                )
            custom = {k: v for k, v in res.items() if k not in ("CPU", "GPU")}
            host = (
                ray.remote(TrainerHost)
                .options(
                    num_cpus=res.get("CPU", 0),
                    num_gpus=res.get("GPU", 0),
                    resources=custom,
                    max_concurrency=4,  # wait() blocks one thread; stop() and node() need others
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0),
                )
                .remote([ring_name(run_id, rank) for rank in range(ranks)], capacity_bytes)
            )
            addrs = ray.get(host.addresses.remote(), timeout=config.placement_timeout_s)
            rings = [RemoteRing(ring_name(run_id, rank), addr, config.hop_window) for rank, addr in enumerate(addrs)]
            return cls(config, started_ray, pg, host, rings)
        except BaseException:
            _release(host, pg, started_ray)
            raise

    def bind_report(self, pull: zmq.Socket) -> str:
        """Bind the controller's report socket on this host's cluster address; its tcp:// endpoint."""
        ip = ray.util.get_node_ip_address()
        port = pull.bind_to_random_port(f"tcp://{ip}")
        return f"tcp://{ip}:{port}"

    def start_trainer(self, job: TrainerJob, run_dir: Path) -> RemoteTrainer:
        """Start ``job`` on the node; paths made absolute (the node's working directory is not ours)."""
        job = dataclasses.replace(job, run_dir=str(Path(run_dir).resolve()), model_path=str(Path(job.model_path).resolve()))
        pid = ray.get(self.host.start.remote(job.to_json()))
        self.trainer = RemoteTrainer(self.host, pid)
        return self.trainer

    def close(self) -> None:
        """Senders first (unacked records are the run's untrained ones), then the node's side, then Ray."""
        for ring in self.rings:
            ring.close()
        try:
            self.counts = ray.get(self.host.stop.remote(), timeout=30)
        except ray.exceptions.RayError:  # the actor or its node is already gone: nothing left to stop there
            pass
        finally:
            _release(self.host, self.pg, self.started_ray)


def _release(host: ray.actor.ActorHandle | None, pg: object | None, started_ray: bool) -> None:
    if host is not None:
        ray.kill(host)
    if pg is not None:
        remove_placement_group(pg)
    if started_ray:
        ray.shutdown()
