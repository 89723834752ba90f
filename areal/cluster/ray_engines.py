"""``cluster.engine_resources``: each inference server the run launches, on a Ray node.

    controller (one process)                                  engine node i (bundle i, SPREAD)
      EngineFleet(placement.launch, count)                      EngineHost (a Ray actor)
        launch(i, port, log) ── ray: launch(port, log) ──────►    server_launcher(engine config,
        ◄── (url http://<node ip>:<port>, pid) ───────────────      host=<node ip>): the local run's
        RemoteEngine: url, pid, log_path, alive(), stop()          launcher, run here ─► the server
          alive(): ray.wait(host.wait(pid)) ◄── its exit code ────  (embedded engine, SGLang, vLLM),
                   or the actor's / node's death                    a child of the actor
      router, gateway, trainer's weight pushes ── HTTP ──────────► http://<node ip>:<port>

The fleet does not change: ``RayEnginePlacement.launch`` is a ``Launcher`` whose servers are
``RemoteEngine``s, with the surface the fleet and ``death_of`` use (``url``, ``pid``,
``log_path``, ``alive()``, ``stop()``, ``exit_status()``). So the router, the trainer's weight
pushes (to the URLs) and ``EngineFleet.supervise`` work as on one host: a dead server is
relaunched by the same actor, on the same node and port, then catches up with the newest weights.
A server listens on its node's address (``--host`` / ``{host}``), never on 127.0.0.1. Ray sets
CUDA_VISIBLE_DEVICES in an actor whose bundle has GPUs and the server inherits it, so
``engine.launch.gpus`` stays empty (the config refuses both). Control calls carry strings (the
engine config as JSON, paths), never our records.

Ray is joined as ``areal/cluster/ray_trainer.py`` does (``cluster.address``, or start Ray on this
host, or the Ray this process already runs in); the engines are placed first, so this module
usually starts or joins Ray and the trainer's placement finds it running. Teardown (``close``,
after the fleet stopped its servers): every server stopped, the actors killed, the placement
group removed, and Ray shut down if this run started it. The actors are owned by the controller:
Ray ends them if the controller dies, and each server dies with its actor (``die_with_parent``).

What is covered: ``engine.replicas`` embedded engines or ``engine.launch.count`` SGLang/vLLM
commands, one bundle of ``cluster.engine_resources`` each (GPU or custom); their URLs to the
controller; a server's death (exit status and log tail, naming its node) and its restart on the
same node; an actor's or node's death counted as the server's death, naming node and resources;
a clear error when no node has the resources within ``cluster.placement_timeout_s``.
What is not covered: moving a lost node's server to another node (its restart fails, so with one
server, or past ``engine.max_restarts``, the run stops naming it); one server across several nodes
(a bundle is one node); ``engine.urls`` (servers that are not the run's; refused). Requirements:
the model and the run directory on storage every node sees at the same path (servers load
``weights/v*`` from there and log to ``<run dir>/engine[-i].log``), and the engine nodes reachable
over HTTP from the controller's and the trainer's nodes.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import ray
from ray.util.placement_group import placement_group

from areal.cluster.config import ClusterConfig
from areal.cluster.placement import bundle_options, join_ray, release
from areal.dataclass_config import build_dataclass
from areal.engine.config import EngineConfig
from areal.engine.fleet import server_launcher
from areal.engine.launch import EngineProcess, exit_status


class EngineHost:
    """On an engine's node (a Ray actor): the local run's launcher, and the server it started."""

    def __init__(self, engine_json: str, model_dir: str, run_dir: str) -> None:
        self.ip = ray.util.get_node_ip_address()
        cfg = build_dataclass(EngineConfig, json.loads(engine_json), "engine.")
        self.start_server, _ = server_launcher(cfg, Path(model_dir), Path(run_dir), host=self.ip, ray_gpus=True)
        self.proc: EngineProcess | None = None

    def node(self) -> tuple[str, str, int]:
        """(node id, node ip, this actor's pid): where the server runs, and whose child it is."""
        return ray.get_runtime_context().get_node_id(), self.ip, os.getpid()

    def launch(self, index: int, port: int, log_path: str) -> tuple[str, int]:
        """Start server ``index`` on ``port`` (0: a free one) and wait until it is healthy; (url, pid)."""
        if self.proc is not None:  # a dead predecessor: its scratch dir goes
            self.proc.stop()
        self.proc = self.start_server(index, port, Path(log_path))
        return self.proc.url, self.proc.pid

    def wait(self, pid: int) -> int:
        """Block until server ``pid`` exits; its return code (runs on one of the actor's threads)."""
        proc = self.proc
        assert proc is not None and proc.pid == pid, (pid, proc and proc.pid)
        return proc.popen.wait()

    def stop(self, timeout_s: float = 10) -> None:
        if self.proc is not None:
            self.proc.stop(timeout_s)


class RemoteEngine:
    """A server on a Ray node, as the fleet sees an ``EngineProcess``."""

    def __init__(self, host: ray.actor.ActorHandle, url: str, pid: int, log_path: str, where: str) -> None:
        self.host, self.url, self.pid, self.log_path, self.where = host, url, pid, log_path, where
        self.returncode: int | None = None
        self.lost = ""  # set when the actor or its node died, and the server with it
        self._exit = host.wait.remote(pid)

    def alive(self) -> bool:
        if self.returncode is None and not self.lost and ray.wait([self._exit], timeout=0)[0]:
            try:
                self.returncode = ray.get(self._exit)
            except ray.exceptions.RayError as e:
                self.lost = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:500]}"
        return self.returncode is None and not self.lost

    def exit_status(self) -> str:
        if self.lost:
            return f"its EngineHost actor or its node was lost, on {self.where}: {self.lost}"
        assert self.returncode is not None
        return f"{exit_status(self.returncode)}, on {self.where}"

    def stop(self, timeout_s: float = 10) -> None:
        try:
            ray.get(self.host.stop.remote(timeout_s), timeout=timeout_s + 30)
        except ray.exceptions.RayError:  # the actor or its node is gone: the server went with it
            pass


class RayEnginePlacement:
    """The run's servers placed on Ray nodes: ``place`` reserves a bundle and starts a host per
    server, ``launch`` is the fleet's ``Launcher``, ``close`` tears it all down."""

    def __init__(
        self, config: ClusterConfig, started_ray: bool, pg: object, hosts: list[ray.actor.ActorHandle], nodes: list[tuple[str, str, int]]
    ) -> None:
        self.config, self.started_ray, self.pg, self.hosts, self.nodes = config, started_ray, pg, hosts, nodes
        self.engines: dict[int, RemoteEngine] = {}  # the newest server of each index

    @classmethod
    def place(
        cls, config: ClusterConfig, run_id: str, engine: EngineConfig, model_dir: Path, run_dir: Path, count: int
    ) -> RayEnginePlacement:
        """Join (or start) Ray, reserve ``count`` bundles of ``cluster.engine_resources`` (SPREAD)
        and start an ``EngineHost`` in each. Blocks up to ``placement_timeout_s``."""
        started_ray = join_ray(config)
        pg, hosts = None, []
        try:
            res = dict(config.engine_resources)
            pg = placement_group([res] * count, strategy="SPREAD", name=f"areal-engines-{run_id}")
            ready, _ = ray.wait([pg.ready()], timeout=config.placement_timeout_s)
            if not ready:
                raise TimeoutError(
                    f"cluster.engine_resources={res} for {count} engine server(s): the Ray cluster had no room for them "
                    f"within cluster.placement_timeout_s={config.placement_timeout_s}s (cluster: {ray.cluster_resources()})"
                )
            engine_json = json.dumps(dataclasses.asdict(engine))
            for i in range(count):
                hosts.append(
                    ray.remote(EngineHost)
                    .options(**bundle_options(res, pg, i, 4))  # wait() blocks a thread; launch(), stop(), node() need others
                    .remote(engine_json, str(Path(model_dir).resolve()), str(Path(run_dir).resolve()))
                )
            nodes = ray.get([h.node.remote() for h in hosts], timeout=config.placement_timeout_s)
            return cls(config, started_ray, pg, hosts, nodes)
        except BaseException:
            release(hosts, pg, started_ray)
            raise

    def where(self, index: int) -> str:
        node_id, ip, _ = self.nodes[index]
        return f"Ray node {node_id} ({ip}) with cluster.engine_resources={dict(self.config.engine_resources)}"

    def launch(self, index: int, port: int, log_path: Path) -> RemoteEngine:
        """Start server ``index`` through its host (on the same node whenever it is restarted)."""
        log = str(Path(log_path).resolve())
        try:
            url, pid = ray.get(self.hosts[index].launch.remote(index, port, log))
        except ray.exceptions.RayActorError as e:  # the fleet's restart path expects a RuntimeError
            raise RuntimeError(f"the EngineHost actor of engine {index} on {self.where(index)} is gone: {e}") from None
        self.engines[index] = RemoteEngine(self.hosts[index], url, pid, log, self.where(index))
        return self.engines[index]

    def placed(self) -> list[str]:
        """One line per server, for the run's log: where it runs, and whose child it is."""
        return [
            f"[cluster] engine {i} on Ray node {self.nodes[i][0]} ({self.nodes[i][1]}) at {e.url} "
            f"(pid {e.pid}, a child of EngineHost actor pid {self.nodes[i][2]})"
            for i, e in sorted(self.engines.items())
        ]

    def close(self) -> None:
        """Every server stopped (the fleet stopped them first), the actors, the group, then Ray."""
        try:
            ray.get([h.stop.remote() for h in self.hosts], timeout=30)
        except ray.exceptions.RayError:  # an actor or its node is already gone: its server went with it
            pass
        finally:
            release(self.hosts, self.pg, self.started_ray)
