"""``cluster.kind=ray``: the trainer on nodes of a Ray cluster, its rings there, fed over TCP.

    controller (this host, one process)                trainer node i (bundle i of the placement group)
      _publish ─► RemoteRing.put_trajectory            TrainerHost i (a Ray actor): node i's ranks
                  TrajectorySender ──── tcp ────────►    TrajectoryReceiver ─► RingWriter (node /dev/shm)
                                                         start_trainer: torchrun --nnodes N --node-rank i
      PULL tcp://<controller ip>:<port> ◄─── TrainerReport / Done / Failed ───┘  reads the rings
      RemoteTrainer.poll() ◄── ray.wait(host.wait) per node ── each node's torchrun exit code

``cluster.trainer_nodes`` = N (default 1) splits ``trainer.ranks`` evenly: node i holds global
ranks ``i * ranks_per_node .. (i + 1) * ranks_per_node - 1``, their rings (named by global rank,
``ring_name(run_id, rank)``, so the controller's ring list is indexed by global rank as on one
host) and their receivers. Each node's ``TrainerJob`` lists every rank's ring; torchrun's static
rendezvous makes ``RANK`` = node rank x ranks per node + local rank, so each rank opens the ring
on its own node. Node 0's host picks the rendezvous port on its node IP; every node's torchrun
meets there (gloo goes out on the interface holding the node's IP, ``areal/trainer/launch.py``).
One bundle of ``cluster.trainer_resources`` per node: STRICT_PACK for one node, STRICT_SPREAD
(every bundle on a different node) for several.

The controller does not change: a ``RemoteRing`` has the surface of a ``RingWriter`` that
``_publish`` uses (``name``, ``put_trajectory(traj, timeout)``, ``close``), and a
``RemoteTrainer`` the ``poll``/``returncode`` of a ``Popen``: None while every node's torchrun
runs, the first non-zero exit (or -1 for a dead actor or node, ``error`` naming the node) fails
the run, 0 once every node exited 0. The hop is ``areal/ring/remote.py``: sequence numbers,
digests and exactly-once commit into the node's ring. Control calls to the actors carry strings
(the job as JSON) and numbers, never our records.

Ray is imported here only: ``cluster.kind=local`` needs no Ray. ``ray.init`` joins
``cluster.address`` (or starts Ray on this host, or uses the Ray this process already runs in,
e.g. a job of the Ray sweep launcher); teardown (``close``) stops every node's trainer process
group, receivers and rings, then the actors and the placement group, and shuts Ray down if this
run started it. The actors are owned by the controller: Ray ends them if the controller dies, and
each node's trainer dies with its actor (``die_with_parent``).

What is covered: the trainer's ranks on one node or split over several (torchrun's rendezvous on
node 0, gloo on CPU or NCCL on GPUs between the nodes), placed by resources, GPU or custom;
trajectories, reports and the exit codes across nodes. Sandboxed rollout workers on other nodes
are ``areal/cluster/ray_rollout.py`` (``cluster.rollout_workers``). What is not covered: uneven
ranks per node; a trainer node's death (it fails the run, naming the node; resume it with
``recover.mode=auto``; a lost rollout worker is survived, see ray_rollout.py); placing the rank
-> node map by anything but bundle order. Requirements: the run directory and the model on storage
every node sees at the same path (rank 0 writes checkpoints and ``weights/v*`` there, engines load
them from there; every rank writes its own files of a checkpoint into rank 0's temporary directory
and reads them back on resume, and writes ``trained_episodes-r{rank}.jsonl``; node i > 0 logs to
``trainer-node{i}.log``), engine URLs the trainer nodes can reach, the trainer nodes reachable
from each other on any port (the rendezvous, gloo/NCCL), and the controller on a node of the
cluster (not Ray Client).
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import ray
import zmq
from ray.util.placement_group import placement_group

from areal.cluster.config import ClusterConfig
from areal.cluster.placement import bundle_options, join_ray, release
from areal.curve import ENV as CURVE_ENV
from areal.curve import CurveKeys, serve_curve
from areal.engine.launch import free_port
from areal.process import stop_group
from areal.protocol import Trajectory
from areal.ring.buffer import RingWriter, ring_name
from areal.ring.remote import TrajectoryReceiver, TrajectorySender
from areal.trainer.config import TrainerJob
from areal.trainer.launch import Rendezvous, start_trainer, trainer_log


class TrainerHost:
    """On one trainer node: one ring per rank of this node, a receiver writing into each, the
    node's trainer processes (one torchrun)."""

    def __init__(self, ring_names: list[str], capacity_bytes: int, keys_json: str = "") -> None:
        self.ip = ray.util.get_node_ip_address()
        keys = CurveKeys.from_json(keys_json) if keys_json else None  # the run's CURVE keys: its receivers serve them
        self.rings = [RingWriter(name, capacity_bytes) for name in ring_names]
        self.receivers = [TrajectoryReceiver(f"tcp://{self.ip}:0", ring, keys=keys).start() for ring in self.rings]
        self.proc: subprocess.Popen | None = None

    def addresses(self) -> list[str]:
        return [r.address for r in self.receivers]

    def node(self) -> tuple[str, str]:
        """(node id, node ip) of this host: where its ranks run."""
        return ray.get_runtime_context().get_node_id(), self.ip

    def free_port(self) -> int:
        """A free TCP port on this node's IP (node 0: torchrun's rendezvous)."""
        return free_port(self.ip)

    def start(
        self, job_json: str, nnodes: int = 1, node_rank: int = 0, master_addr: str = "", master_port: int = 0, client_keys: str = ""
    ) -> int:
        """Start this node's ranks of ``job_json`` (a ``TrainerJob``); returns the pid on this node.
        ``nnodes`` > 1: torchrun meets the other nodes' at ``master_addr:master_port``.
        ``client_keys``: the run's CURVE client keys, in the ranks' environment (their reports)."""
        job = TrainerJob.from_json(job_json)
        rendezvous = None
        if nnodes > 1:
            rendezvous = Rendezvous(master_addr, master_port, nnodes, node_rank, self.ip)
        self.proc = start_trainer(job, Path(job.run_dir), rendezvous, env={CURVE_ENV: client_keys} if client_keys else None)
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

    def __init__(self, name: str, addr: str, window: int, keys: CurveKeys | None = None) -> None:
        self.name = name
        self.sender = TrajectorySender(addr, window=window, keys=keys)

    def put_trajectory(self, traj: Trajectory, timeout_s: float | None = None) -> None:
        self.sender.put(traj, timeout_s)  # kept until the node's ring holds it; resent after a reconnection

    def close(self, unlink: bool = False, timeout_s: float = 0) -> None:
        self.sender.close(timeout_s=timeout_s)


class RemoteTrainer:
    """The trainer's processes on its nodes, as the controller sees one ``Popen``: ``poll``, ``returncode``."""

    def __init__(self, hosts: list[ray.actor.ActorHandle], nodes: list[tuple[str, str]], pids: list[int]) -> None:
        self.pid, self.pids = pids[0], pids  # on each trainer node
        self.nodes = nodes
        self.returncode: int | None = None
        self.error = ""  # which node ended the run, and how
        self.log_name = "trainer.log"  # the log of the node that ended it (in the run directory)
        self._exits = {host.wait.remote(): i for i, host in enumerate(hosts)}
        self._codes: dict[int, int] = {}  # node rank -> exit code, of the nodes whose trainer exited

    def poll(self) -> int | None:
        """None while every node's trainer runs and none failed; the first failure's code (-1: the
        actor or its node died); 0 once every node's exited 0."""
        pending = [ref for ref, i in self._exits.items() if i not in self._codes]
        if self.returncode is not None or not pending:
            return self.returncode
        for ref in ray.wait(pending, num_returns=len(pending), timeout=0)[0]:
            i = self._exits[ref]
            try:
                code, how = ray.get(ref), ""
            except ray.exceptions.RayError as e:  # the node or the actor died: its ranks with it
                code, how = -1, f": its actor or node died: {e}"
            self._codes[i] = code
            if code != 0 and self.returncode is None:
                node_id, ip = self.nodes[i]
                self.returncode = code
                self.log_name = trainer_log(Path(), i).name
                self.error = f"trainer node {i} (Ray node {node_id}, {ip}; log {trainer_log(Path(), i)}) exited with code {code}{how}"
        if self.returncode is None and len(self._codes) == len(self._exits):
            self.returncode = 0
        return self.returncode


class RayTrainerPlacement:
    """The trainer of one run placed on Ray nodes; ``place`` builds it, ``close`` tears it down."""

    def __init__(
        self, config: ClusterConfig, started_ray: bool, pg: object, hosts: list[ray.actor.ActorHandle], rings: list[RemoteRing]
    ) -> None:
        self.config, self.started_ray, self.pg, self.hosts, self.rings = config, started_ray, pg, hosts, rings
        self.nodes: list[tuple[str, str]] = ray.get([h.node.remote() for h in hosts])  # (node id, ip) per node rank
        self.node_id, self.node_ip = self.nodes[0]  # node 0: where rank 0 runs
        self.ranks_per_node = len(rings) // len(hosts)
        self.trainer: RemoteTrainer | None = None
        self.counts: dict[str, int] = {}
        self.keys: CurveKeys | None = None  # the run's CURVE keys (cluster.encrypt)
        self.report_auth: object | None = None  # the ZAP handler of the report socket

    @classmethod
    def place(cls, config: ClusterConfig, run_id: str, ranks: int, capacity_bytes: int) -> RayTrainerPlacement:
        """Join (or start) Ray, reserve one bundle per trainer node, start a host on each with one
        ring and receiver per rank of that node, and connect a sender to each ring. Blocks up to
        ``placement_timeout_s``."""
        nnodes = config.trainer_nodes
        if ranks % nnodes:
            raise ValueError(f"trainer.ranks={ranks} cannot be split evenly over cluster.trainer_nodes={nnodes}")
        per_node = ranks // nnodes
        started_ray = join_ray(config)
        pg, hosts = None, []
        keys = CurveKeys.generate() if config.encrypt else None  # one set per run (areal/curve.py)
        try:
            res = dict(config.trainer_resources)
            strategy = "STRICT_PACK" if nnodes == 1 else "STRICT_SPREAD"  # several: each bundle on its own node
            pg = placement_group([dict(res) for _ in range(nnodes)], strategy=strategy, name=f"areal-trainer-{run_id}")
            ready, _ = ray.wait([pg.ready()], timeout=config.placement_timeout_s)
            if not ready:
                where = "no node" if nnodes == 1 else f"fewer than cluster.trainer_nodes={nnodes} distinct nodes"
                raise TimeoutError(
                    f"cluster.trainer_resources={res}: {where} of the Ray cluster had them free within "
                    f"cluster.placement_timeout_s={config.placement_timeout_s}s (cluster: {ray.cluster_resources()})"
                )
            for node_rank in range(nnodes):
                names = [ring_name(run_id, node_rank * per_node + local) for local in range(per_node)]  # global ranks
                hosts.append(
                    ray.remote(TrainerHost)
                    .options(**bundle_options(res, pg, node_rank, 4))  # wait() blocks a thread; stop(), node() need others
                    .remote(names, capacity_bytes, keys.to_json() if keys else "")
                )
            addrs = [a for per_host in ray.get([h.addresses.remote() for h in hosts], timeout=config.placement_timeout_s) for a in per_host]
            client = keys.client_side() if keys else None
            rings = [RemoteRing(ring_name(run_id, rank), addr, config.hop_window, client) for rank, addr in enumerate(addrs)]
            placement = cls(config, started_ray, pg, hosts, rings)
            placement.keys = keys
            return placement
        except BaseException:
            release(hosts, pg, started_ray)
            raise

    def placed(self) -> list[str]:
        """One line per trainer node: where it is and which global ranks it runs."""
        per = self.ranks_per_node
        return [f"trainer placed on Ray node {nid} ({ip}): ranks {i * per}-{(i + 1) * per - 1}" for i, (nid, ip) in enumerate(self.nodes)]

    def bind_report(self, pull: zmq.Socket) -> str:
        """Bind the controller's report socket on this host's cluster address (a CURVE server
        admitting only the run's trainer ranks, with ``cluster.encrypt``); its tcp:// endpoint."""
        ip = ray.util.get_node_ip_address()
        if self.keys is not None:
            self.report_auth = serve_curve(pull, self.keys)
        port = pull.bind_to_random_port(f"tcp://{ip}")
        return f"tcp://{ip}:{port}"

    def start_trainer(self, job: TrainerJob, run_dir: Path) -> RemoteTrainer:
        """Start ``job`` on every trainer node; paths made absolute (a node's working directory is
        not ours). Several nodes meet at a free port of node 0."""
        job = dataclasses.replace(job, run_dir=str(Path(run_dir).resolve()), model_path=str(Path(job.model_path).resolve()))
        nnodes = len(self.hosts)
        port = ray.get(self.hosts[0].free_port.remote()) if nnodes > 1 else 0
        client = self.keys.client_side().to_json() if self.keys else ""
        starts = [h.start.remote(job.to_json(), nnodes, i, self.node_ip, port, client) for i, h in enumerate(self.hosts)]
        self.trainer = RemoteTrainer(self.hosts, self.nodes, ray.get(starts))
        return self.trainer

    def close(self) -> None:
        """Senders first (unacked records are the run's untrained ones), then every node's side, then Ray."""
        for ring in self.rings:
            ring.close()
        try:
            stops = [h.stop.remote() for h in self.hosts]
            for stop in stops:
                try:
                    for k, v in ray.get(stop, timeout=30).items():
                        self.counts[k] = self.counts.get(k, 0) + v
                except ray.exceptions.RayError:  # the actor or its node is already gone: nothing left to stop there
                    pass
        finally:
            if self.report_auth is not None:
                self.report_auth.stop()
            release(self.hosts, self.pg, self.started_ray)
