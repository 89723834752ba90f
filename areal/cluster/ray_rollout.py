"""``cluster.rollout_workers=N``: sandboxed episodes on rollout workers placed on Ray nodes.

    controller (one process)                                   rollout node (a placement-group bundle)
      Gateway ── ZeroMQ door ipc://  (local runs, as before)     RolloutWorker (a Ray actor)
              └─ ZeroMQ door tcp://<controller ip>:<port> ◄─tcp──  GatewayBridge: ipc:///<tmp>/gateway.sock
      RayRunner.run_episode                                          ▲ one TCP connection per relay connection,
        least-loaded live worker (slots_per_worker each)             │ bytes copied as they come
        ── ray: run_episode(id, row as JSON, session key) ──►      Zygote ─► episode ─► relay (DEALER, ipc://)
        ◄── EpisodeOutcome (msgpack bytes) ───────────────────┘    (the node-local sandbox of a local run)

This first step keeps the gateway in the controller: every LLM call of every worker's agents comes
to the one gateway over TCP, so token accounting, sessions, versions and the trajectories stay
where they are (``_run_episode`` opens and closes the session; ``_publish`` writes the rings).
Only the sandboxes move. The episode processes keep their network namespace (loopback only) and
reach an ``ipc://`` socket on their node, as locally; the worker's bridge carries each relay
connection to the controller's door byte for byte (the ZMTP stream passes through untouched), so
the door sees one connection per relay and charges it to the session whose key its first request
carries: session keys authenticate every call, as over ``ipc://``.

Dispatch and back-pressure: a ``RayRunner`` is an ``EpisodeRunner`` (``run_episode``/``close``).
Each worker takes ``cluster.slots_per_worker`` episodes at once; an episode goes to the live worker
with the fewest in flight, and waits while every worker is full, so admission spans all workers.

Worker loss: when a worker's actor or node dies (``RayActorError``), its in-flight episodes come
back ``crashed`` with an error naming the worker and its node, ``lost(outcome)`` says so, the
controller's infrastructure path runs the group again (``_run_group``), the worker is dropped from
dispatch and reported once, and the run goes on with the others; with none left, ``run_episode``
raises ``RolloutWorkersLost`` (the run fails naming every loss). A worker whose zygote dies
restarts it (up to ``rollout.max_zygote_restarts`` times, then it counts as lost); the episodes it
took down are ``lost`` too. Teardown (``close``): each worker shuts its zygote down (its episodes
killed) and its bridge, then the actors are killed and the placement group removed. Ray ends the
actors if the controller dies, and each zygote dies with its actor (``die_with_parent``).

Control calls carry strings and bytes (the row as JSON, the outcome as msgpack), never pickled records.

What is covered: N workers placed by resources with a SPREAD placement group, one zygote each
(the run's sandbox config, agent spec and agent kwargs), admission across workers, a lost worker
or node (its episodes re-admitted, the run continuing), teardown with the run.
What is not covered:
- a gateway per worker (the engines called from the worker's node, token accounting merged):
  the controller's gateway serves every call, so its CPU bounds the run's LLM calls per second;
- replacing a lost worker (Ray reschedules its bundle, nothing starts a new actor there);
- inline agents and RolloutWorkflow objects on workers (they run in the controller's loop);
- encryption between the nodes: session keys and prompts cross the network in clear (a cluster's
  private network, as for the trajectory hop);
- the door's per-owner cap before a key is seen: a node's relay connections share one owner (its
  host) until their first request, so a burst of more than ``gateway.max_connections_per_session``
  new connections from one node has the excess cut (their requests get a 502).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from areal.agent import EXEC_PREFIX
from areal.cluster.config import ClusterConfig
from areal.failures import INFRASTRUCTURE
from areal.gateway import Gateway, serve_zmq
from areal.process import owned_temp_dir
from areal.protocol import EpisodeOutcome
from sandbox.isolation import SandboxConfig
from sandbox.zygote import Zygote

WORKER_LOST = "rollout worker lost"  # failure_cause of the episodes a lost worker took down
SANDBOX_DIED = "sandbox zygote died"  # ... of those a worker's dying zygote took down (restarted)
_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(EpisodeOutcome)


class RolloutWorkersLost(RuntimeError):
    """Every rollout worker of the run was lost: no episode can run."""


async def _copy(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
    try:
        while data := await src.read(1 << 16):
            dst.write(data)
            await dst.drain()
    except ConnectionError:  # one side hung up or was reset: the pair is closed by the caller
        pass


class GatewayBridge:
    """A node-local ``ipc://`` socket for the sandboxes, carried to the controller's gateway over TCP:
    each accepted connection gets its own TCP connection, and either side closing closes both."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.server: asyncio.AbstractServer | None = None

    @classmethod
    async def open(cls, path: str, gateway: str) -> GatewayBridge:
        """Listen on ``path`` (a Unix socket), forwarding to ``gateway`` (``tcp://host:port``)."""
        host, _, port = gateway.removeprefix("tcp://").rpartition(":")
        bridge = cls(host, int(port))
        bridge.server = await asyncio.start_unix_server(bridge._carry, path=path)
        return bridge

    async def _carry(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection(self.host, self.port)
        except OSError:  # the gateway cannot be reached: the relay sees the close and answers 502
            writer.close()
            return
        pipes = [asyncio.create_task(_copy(reader, up_writer)), asyncio.create_task(_copy(up_reader, writer))]
        try:
            await asyncio.wait(pipes, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pipe in pipes:
                pipe.cancel()
            writer.close()
            up_writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


class RolloutWorker:
    """On a rollout node (a Ray actor): the bridge to the controller's gateway and a zygote whose
    agents use it. Async methods: they run on the actor's event loop, as many at once as its slots."""

    def __init__(self, index: int, gateway: str, max_restarts: int) -> None:
        self.index, self.gateway, self.max_restarts = index, gateway, max_restarts
        self.sock_dir = ""
        self.bridge: GatewayBridge | None = None
        self.zygote: Zygote | None = None
        self.restarts = 0
        self.dead = ""  # why this worker can run no more episodes (its zygote's restarts are spent)
        self.restart_lock: asyncio.Lock | None = None

    async def start(self, agent: str, sandbox_json: str, log_dir: str, agent_kwargs_json: str) -> str:
        """Open the bridge and start the zygote; {node_id, ip, warnings} as JSON."""
        self.sock_dir = owned_temp_dir("worker")  # ipc paths must stay short
        path = f"{self.sock_dir}/gateway.sock"
        self.bridge = await GatewayBridge.open(path, self.gateway)
        config = SandboxConfig(**json.loads(sandbox_json))
        self.zygote = await Zygote.start(agent, f"ipc://{path}", config, log_dir, json.loads(agent_kwargs_json))
        self.restart_lock = asyncio.Lock()
        node = {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address()}
        return json.dumps({**node, "warnings": self.zygote.ready.warnings})

    async def run_episode(self, episode_id: str, data_json: str, api_key: str, deadline_s: float) -> bytes:
        """One sandboxed episode; its EpisodeOutcome as msgpack."""
        assert self.zygote is not None
        if self.dead:
            outcome = EpisodeOutcome(episode_id, "crashed", error=self.dead, failure_class=INFRASTRUCTURE, failure_cause=WORKER_LOST)
            return _encoder.encode(outcome)
        zygote, generation = self.zygote, self.restarts
        outcome = await zygote.run_episode(episode_id, json.loads(data_json), api_key, deadline_s)
        if outcome.status == "crashed" and (not zygote.alive or self.restarts != generation):
            cause = await self._restart(generation, outcome.error)
            outcome = msgspec.structs.replace(outcome, failure_class=INFRASTRUCTURE, failure_cause=cause)
        return _encoder.encode(outcome)

    async def _restart(self, generation: int, reason: str) -> str:
        """Restart the zygote that died under generation ``generation`` (once, whoever sees it first);
        the cause of the episodes it took down."""
        assert self.restart_lock is not None and self.zygote is not None
        async with self.restart_lock:
            if self.restarts == generation and not self.dead and not self.zygote.alive:
                if self.restarts >= self.max_restarts:
                    self.dead = (
                        f"the zygote of rollout worker {self.index} died {self.restarts + 1} times "
                        f"(rollout.max_zygote_restarts={self.max_restarts}); last: {reason[-2000:]}"
                    )
                else:
                    self.restarts += 1
                    await self.zygote.restart()
        return WORKER_LOST if self.dead else SANDBOX_DIED

    async def stop(self) -> None:
        """Shut the zygote down (it kills its episodes), then the bridge; remove the socket folder."""
        if self.zygote is not None:
            await self.zygote.close()
        if self.bridge is not None:
            await self.bridge.close()
        shutil.rmtree(self.sock_dir, ignore_errors=True)


@dataclasses.dataclass
class _Worker:
    """The controller's view of one worker: where it runs, its episodes in flight, why it is gone."""

    index: int
    actor: ray.actor.ActorHandle
    node_id: str
    ip: str
    load: int = 0
    episodes: int = 0  # dispatched to it in all
    dead: str = ""

    @property
    def name(self) -> str:
        return f"rollout worker {self.index} on node {self.node_id} ({self.ip})"


class RayRunner:
    """The ``EpisodeRunner`` over the run's rollout workers; ``start`` places them, ``close`` removes them."""

    def __init__(self, workers: list[_Worker], pg: Any, door: asyncio.Task, slots: int, write: Callable[[str], None]) -> None:
        self.workers, self.pg, self.door, self.slots, self.write = workers, pg, door, slots, write
        self.freed = asyncio.Event()  # set whenever a slot frees or a worker is lost: waiters look again
        self.lost_ids: set[str] = set()

    @classmethod
    async def start(
        cls,
        config: ClusterConfig,
        gateway: Gateway,
        agent: str,
        sandbox: SandboxConfig,
        log_dir: Path,
        agent_kwargs: dict[str, Any],
        max_restarts: int,
        run_id: str,
        write: Callable[[str], None],
    ) -> RayRunner:
        """Serve the gateway on TCP, reserve ``cluster.rollout_workers`` bundles of
        ``cluster.worker_resources`` (SPREAD), start a worker in each and wait for its zygote.
        Ray must be initialised (the trainer's placement did it). Blocks up to ``placement_timeout_s``."""
        ip = ray.util.get_node_ip_address()
        ready = asyncio.Event()
        door = asyncio.create_task(serve_zmq(gateway, f"tcp://{ip}:0", ready))
        pg, workers = None, []
        try:
            waiter = asyncio.create_task(ready.wait())
            await asyncio.wait([door, waiter], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()
            if door.done():
                door.result()  # it could not bind: raise why
            endpoint = next(d.address for d in gateway.doors if d.address.startswith(f"tcp://{ip}:"))
            res, n = dict(config.worker_resources), config.rollout_workers
            pg = placement_group([res] * n, strategy="SPREAD", name=f"areal-rollout-{run_id}")
            try:
                await asyncio.wait_for(pg.ready(), config.placement_timeout_s)
            except TimeoutError:
                raise TimeoutError(
                    f"cluster.rollout_workers={n} x cluster.worker_resources={res}: the Ray cluster could not hold them "
                    f"within cluster.placement_timeout_s={config.placement_timeout_s}s (cluster: {ray.cluster_resources()})"
                ) from None
            actor_class = ray.remote(RolloutWorker)
            custom = {k: v for k, v in res.items() if k not in ("CPU", "GPU")}
            actors = [
                actor_class.options(
                    num_cpus=res.get("CPU", 0),
                    num_gpus=res.get("GPU", 0),
                    resources=custom,
                    max_concurrency=config.slots_per_worker + 4,  # its episodes, plus stop()
                    scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=i),
                ).remote(i, endpoint, max_restarts)
                for i in range(n)
            ]
            workers = [_Worker(i, actor, "", "") for i, actor in enumerate(actors)]
            sandbox_json, kwargs_json = json.dumps(dataclasses.asdict(sandbox)), json.dumps(agent_kwargs)
            spec = node_agent_spec(agent)
            starts = [
                a.start.remote(spec, sandbox_json, str(Path(log_dir).resolve() / f"worker-{i}"), kwargs_json) for i, a in enumerate(actors)
            ]
            infos = await asyncio.wait_for(asyncio.gather(*starts), config.placement_timeout_s)
            for w, info in zip(workers, map(json.loads, infos)):
                w.node_id, w.ip = info["node_id"], info["ip"]
                write(f"[cluster] {w.name}")
                for warning in info["warnings"]:
                    write(f"[sandbox] warning ({w.name}): {warning}")
            write(f"[cluster] the gateway serves the rollout workers at {endpoint}")
            return cls(workers, pg, door, config.slots_per_worker, write)
        except BaseException:
            _release([w.actor for w in workers], pg, door)
            raise

    @property
    def live(self) -> list[_Worker]:
        return [w for w in self.workers if not w.dead]

    def _pick(self) -> _Worker | None:
        """The live worker with the fewest episodes in flight, if one has a free slot."""
        return min((w for w in self.live if w.load < self.slots), key=lambda w: w.load, default=None)

    async def run_episode(self, episode_id: str, data: dict, api_key: str, deadline_s: float) -> EpisodeOutcome:
        """Run one episode on a worker (waiting for a free slot on any). Never raises for a lost
        worker: its episodes come back crashed; raises ``RolloutWorkersLost`` once none is left."""
        while (worker := self._pick()) is None:
            if not self.live:
                raise RolloutWorkersLost("every rollout worker was lost: " + "; ".join(f"{w.name}: {w.dead}" for w in self.workers))
            self.freed.clear()
            await self.freed.wait()
        worker.load += 1  # no await between the pick and this: the loop is ours
        worker.episodes += 1
        ref = worker.actor.run_episode.remote(episode_id, json.dumps(data), api_key, deadline_s)
        try:
            outcome = _decoder.decode(await ref)
        except ray.exceptions.RayActorError as e:  # its process or node died
            why = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:500]}"
            outcome = EpisodeOutcome(episode_id, "crashed", error=why, failure_class=INFRASTRUCTURE, failure_cause=WORKER_LOST)
        except asyncio.CancelledError:  # the run is stopping: the worker's zygote ends it by its deadline or shutdown
            ray.cancel(ref)
            raise
        finally:
            worker.load -= 1
            self.freed.set()
        if outcome.status == "crashed" and outcome.failure_cause in (WORKER_LOST, SANDBOX_DIED):
            self.lost_ids.add(episode_id)
            if outcome.failure_cause == WORKER_LOST:
                self._drop(worker, outcome.error)
                outcome = msgspec.structs.replace(outcome, error=f"{worker.name} was lost: {outcome.error}")
            else:
                outcome = msgspec.structs.replace(outcome, error=f"{worker.name}: its zygote died (restarted): {outcome.error}")
        return outcome

    def lost(self, outcome: EpisodeOutcome) -> bool:
        """Whether ``outcome`` crashed because its worker (or the worker's zygote) died under it:
        an infrastructure failure whose group the controller runs again."""
        return outcome.episode_id in self.lost_ids

    def _drop(self, worker: _Worker, why: str) -> None:
        if worker.dead:
            return
        worker.dead = why
        self.write(f"[cluster] {worker.name} was lost, {len(self.live)} of {len(self.workers)} left: {why.splitlines()[0][:300]}")
        self.freed.set()

    async def close(self) -> None:
        """Stop every live worker (its zygote and bridge), then kill the actors and remove the group."""
        self.write("[cluster] episodes per rollout worker: " + ", ".join(f"{w.index}: {w.episodes}" for w in self.workers))
        try:
            stops = [w.actor.stop.remote() for w in self.live]
            results = await asyncio.wait_for(asyncio.gather(*stops, return_exceptions=True), 30)
            for r in results:
                if isinstance(r, BaseException) and not isinstance(r, ray.exceptions.RayActorError):
                    raise r  # a worker that died meanwhile has nothing left to stop; anything else is a bug
        finally:
            _release([w.actor for w in self.workers], self.pg, self.door)
            with contextlib.suppress(asyncio.CancelledError):
                await self.door


def _release(actors: list[ray.actor.ActorHandle], pg: Any | None, door: asyncio.Task) -> None:
    for actor in actors:
        ray.kill(actor)
    if pg is not None:
        remove_placement_group(pg)
    door.cancel()


def node_agent_spec(spec: str) -> str:
    """``spec`` with a relative agent file made absolute: a worker's working directory is not ours
    (the file must be on storage every node mounts at the same path, as the run directory)."""
    prefix = EXEC_PREFIX if spec.startswith(EXEC_PREFIX) else ""
    target, sep, attr = (spec[len(prefix) :], "", "") if prefix else spec.rpartition(":")
    path = Path(target)
    if (prefix or target.endswith(".py") or "/" in target) and not path.is_absolute() and path.exists():
        target = str(path.resolve())
    return f"{prefix}{target}{sep}{attr}"
