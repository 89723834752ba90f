"""``cluster.rollout_workers=N``: sandboxed episodes on rollout workers placed on Ray nodes.

    controller (one process)                               rollout node (a placement-group bundle)
      RayRunner.run_session                                  RolloutWorker (a Ray actor)
        least-loaded live worker (slots_per_worker each)       its own Gateway ── HTTP ──► engines (engine URLs)
        ── ray: run_session(id, row as JSON, temperature) ──►    ▲ ZeroMQ door ipc:///<tmp>/gateway.sock
        ◄── WorkerEpisode (msgpack bytes): the outcome and    Zygote ─► episode ─► relay (DEALER, ipc://)
            the session's interactions, token by token        (the node-local sandbox of a local run)
      Episodes.settle (reward, checks) ─► trajectories ─► _publish (the rings, local or the trainer node's)

``cluster.gateway=worker`` (the default): each worker serves its own agents with its own
``Gateway``: the tokenizer (``model.path``, on storage every node sees), the run's gateway limits
and a client of the engines, so every LLM call goes from the worker's node to an engine and the
controller's CPU no longer bounds the run's calls per second. The worker opens a session per
episode, runs it, closes the session and returns the outcome with the session's interactions
(prompt ids, sampled ids, logprobs, versions, rewards set through the gateway). The controller
scores, classifies and publishes them exactly as a local episode's; the versions are the engines'
own, so staleness accounting does not change. Engine URLs on the controller host's loopback are
refused by a worker on another host, naming what to set (engines on Ray nodes, ``engine.urls``
other nodes reach, or the controller's gateway).

``cluster.gateway=controller``: the gateway stays in the controller and the worker carries each
relay connection to its ZeroMQ door over TCP byte for byte (``GatewayBridge``); the door charges
the connection to the session whose key its first request carries, as over ``ipc://``.

Dispatch and back-pressure: a ``RayRunner`` is an ``EpisodeRunner`` (``run_episode``/``close``;
with the workers' own gateways ``owns_sessions`` and ``run_session``). Each worker takes
``cluster.slots_per_worker`` episodes at once; an episode goes to the live worker with the fewest in
flight, and waits while every worker is full, so admission spans all workers.

Worker loss: when a worker's actor or node dies (``RayActorError``), its in-flight episodes come
back ``crashed`` with an error naming the worker and its node (and an empty session: what the
worker's gateway recorded died with it), ``lost(outcome)`` says so, the controller's
infrastructure path runs the group again (``_run_group``), the worker is dropped from dispatch and
reported once, and the run goes on with the others; with none left, ``run_episode`` raises
``RolloutWorkersLost`` (the run fails naming every loss). A worker whose zygote dies restarts it
(up to ``rollout.max_zygote_restarts`` times, then it counts as lost); the episodes it took down
are ``lost`` too. A lost worker is replaced (up to ``cluster.max_worker_replacements`` times in a
run): a new worker in its bundle, once Ray has placed the bundle again on a live node with its
resources (one already free, or a node that joins), waited for up to ``placement_timeout_s``;
while one is starting, episodes wait for it rather than fail. Teardown (``close``): each worker
shuts its zygote down (its episodes killed) and its gateway or bridge, then the actors are killed
and the placement group removed. Ray ends the actors if the controller dies, and each zygote dies
with its actor (``die_with_parent``).

Control calls carry strings and bytes (the row as JSON, outcomes and sessions as msgpack), never
pickled records.

What is covered: N workers placed by resources with a SPREAD placement group, one zygote and one
gateway each (the run's sandbox config, agent spec and agent kwargs), admission across workers, the
run's agent evaluation on the workers, a lost worker or node (its episodes re-admitted, the run
continuing, the worker replaced where the cluster can place it), teardown with the run.
What is not covered:
- trajectories from the worker straight to the trainer's node: the session record comes back to
  the controller (one Ray reply per episode), which publishes it over the trajectory hop;
- inline agents and RolloutWorkflow objects on workers (they run in the controller's loop);
- encryption of this module's own traffic: the episodes' records travel in Ray's replies (Ray's
  token authentication; its TLS if the cluster sets it up), the worker gateways' engine calls are
  plain HTTP, and with ``cluster.gateway=controller`` the relay streams cross to the controller's
  door in clear (the trajectory hop and the trainer's reports are CURVE: areal/curve.py);
- with ``cluster.gateway=controller``, the door's per-owner cap before a key is seen: a node's
  relay connections share one owner (its host) until their first request, so a burst of more than
  ``gateway.max_connections_per_session`` new connections from one node has the excess cut.
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
from ray.util.placement_group import placement_group

from areal.agent.failures import INFRASTRUCTURE
from areal.agent.spec import EXEC_PREFIX
from areal.cluster.config import ClusterConfig
from areal.cluster.placement import bundle_options, release
from areal.gateway import Gateway, serve_zmq
from areal.gateway.core import GatewayConfig, Session
from areal.gateway.tree import Interaction
from areal.process import owned_temp_dir
from areal.protocol import EpisodeOutcome
from sandbox.isolation import SandboxConfig
from sandbox.zygote_client import Zygote

WORKER_LOST = "rollout worker lost"  # failure_cause of the episodes a lost worker took down
SANDBOX_DIED = "sandbox zygote died"  # ... of those a worker's dying zygote took down (restarted)
_LOOPBACK = ("127.", "localhost", "[::1]")


class WorkerEpisode(msgspec.Struct):
    """What a worker with its own gateway sends back per episode: the outcome and the session's
    record, token by token (the controller scores, classifies and publishes it as a local one)."""

    outcome: EpisodeOutcome
    interactions: dict[str, Interaction]  # the session's, in call order
    drift: int = 0  # follow-up calls whose history matched no recorded reply


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(EpisodeOutcome)
_episode_decoder = msgspec.msgpack.Decoder(WorkerEpisode)


@dataclasses.dataclass
class WorkerGatewaySpec:
    """How a worker builds its own gateway (``cluster.gateway=worker``): the tokenizer's model dir
    (on storage every node sees), the engines' kind and URLs, the run's gateway limits."""

    model_dir: str
    engine_kind: str
    urls: list[str]
    config: dict[str, Any]
    controller_ip: str = ""  # a loopback engine URL is refused on any other host

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))


async def _own_gateway(spec: WorkerGatewaySpec, address: str) -> tuple[Gateway, asyncio.Task]:
    """The worker's gateway, serving ``address`` (node-local ``ipc://``) for its sandboxes."""
    from transformers import AutoTokenizer

    from areal.engine.serving import engine_client

    ip = ray.util.get_node_ip_address()
    local = [u for u in spec.urls if u.split("://", 1)[-1].startswith(_LOOPBACK)]
    if local and ip != spec.controller_ip:
        raise RuntimeError(
            f"engine URLs {local} are the controller host's loopback, which this node ({ip}) cannot reach: "
            "place the engines on Ray nodes (cluster.engine_resources), give engine.urls other nodes reach, "
            "or keep the gateway in the controller (cluster.gateway=controller)"
        )
    tokenizer = await asyncio.to_thread(AutoTokenizer.from_pretrained, spec.model_dir)
    gateway = Gateway(engine_client(spec.engine_kind, spec.urls), tokenizer, GatewayConfig(**spec.config))
    ready = asyncio.Event()
    serving = asyncio.create_task(serve_zmq(gateway, address, ready))
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait([serving, waiter], return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if serving.done():
        serving.result()  # it could not bind: raise why
    return gateway, serving


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
    """On a rollout node (a Ray actor): a zygote, and the gateway its agents reach over a node-local
    ``ipc://`` socket: the worker's own (``gateway_json``: it calls the engines itself and records
    the sessions), or a bridge to the controller's. Async methods: they run on the actor's event
    loop, as many at once as its slots."""

    def __init__(self, index: int, gateway: str, max_restarts: int) -> None:
        self.index, self.gateway, self.max_restarts = index, gateway, max_restarts
        self.sock_dir = ""
        self.bridge: GatewayBridge | None = None
        self.own: Gateway | None = None  # the worker's own gateway (cluster.gateway=worker)
        self.serving: asyncio.Task | None = None
        self.zygote: Zygote | None = None
        self.restarts = 0
        self.dead = ""  # why this worker can run no more episodes (its zygote's restarts are spent)
        self.restart_lock: asyncio.Lock | None = None

    async def start(self, agent: str, sandbox_json: str, log_dir: str, agent_kwargs_json: str, gateway_json: str = "") -> str:
        """Start the gateway (its own, or the bridge to the controller's) and the zygote; {node_id,
        ip, warnings} as JSON."""
        self.sock_dir = owned_temp_dir("worker")  # ipc paths must stay short
        path = f"{self.sock_dir}/gateway.sock"
        if gateway_json:
            self.own, self.serving = await _own_gateway(WorkerGatewaySpec(**json.loads(gateway_json)), f"ipc://{path}")
        else:
            self.bridge = await GatewayBridge.open(path, self.gateway)
        config = SandboxConfig(**json.loads(sandbox_json))
        self.zygote = await Zygote.start(agent, f"ipc://{path}", config, log_dir, json.loads(agent_kwargs_json))
        self.restart_lock = asyncio.Lock()
        node = {"node_id": ray.get_runtime_context().get_node_id(), "ip": ray.util.get_node_ip_address()}
        return json.dumps({**node, "warnings": self.zygote.ready.warnings})

    async def run_episode(self, episode_id: str, data_json: str, api_key: str, deadline_s: float) -> bytes:
        """One sandboxed episode; its EpisodeOutcome as msgpack."""
        return _encoder.encode(await self._episode(episode_id, data_json, api_key, deadline_s))

    async def run_session(self, episode_id: str, data_json: str, deadline_s: float, temperature: float | None) -> bytes:
        """One sandboxed episode in a session of the worker's own gateway (sampled at
        ``temperature`` when set); a ``WorkerEpisode`` as msgpack. The session is closed whatever
        happens, a cancelled episode's too."""
        assert self.own is not None
        key = self.own.open_session(episode_id, temperature)
        try:
            outcome = await self._episode(episode_id, data_json, key, deadline_s)
        finally:
            session = self.own.close_session(key)
        return _encoder.encode(WorkerEpisode(outcome, session.interactions, session.drift))

    async def _episode(self, episode_id: str, data_json: str, api_key: str, deadline_s: float) -> EpisodeOutcome:
        """One sandboxed episode on the zygote; a crash its death caused is the infrastructure's
        (the zygote restarted, or the worker dead once its restarts are spent)."""
        assert self.zygote is not None
        if self.dead:
            return EpisodeOutcome(episode_id, "crashed", error=self.dead, failure_class=INFRASTRUCTURE, failure_cause=WORKER_LOST)
        zygote, generation = self.zygote, self.restarts
        outcome = await zygote.run_episode(episode_id, json.loads(data_json), api_key, deadline_s)
        if outcome.status == "crashed" and (not zygote.alive or self.restarts != generation):
            cause = await self._restart(generation, outcome.error)
            outcome = msgspec.structs.replace(outcome, failure_class=INFRASTRUCTURE, failure_cause=cause)
        return outcome

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
        if self.serving is not None:
            self.serving.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.serving
        if self.own is not None:
            await self.own.engine.close()
        shutil.rmtree(self.sock_dir, ignore_errors=True)


@dataclasses.dataclass
class _Worker:
    """The controller's view of one worker: where it runs, its episodes in flight, why it is gone."""

    index: int
    actor: ray.actor.ActorHandle
    bundle: int  # its bundle in the run's placement group (a replacement takes the lost worker's)
    node_id: str = ""
    ip: str = ""
    load: int = 0
    episodes: int = 0  # dispatched to it in all
    dead: str = ""

    @property
    def name(self) -> str:
        return f"rollout worker {self.index} on node {self.node_id} ({self.ip})"


@dataclasses.dataclass
class _Spawner:
    """Starts a worker in a bundle of the run's placement group, as the run's first ones were."""

    pg: Any
    resources: dict[str, float]
    concurrency: int
    init_args: tuple  # (gateway endpoint, max zygote restarts)
    start_args: tuple  # (agent spec, sandbox JSON, log root, agent kwargs JSON, gateway JSON)
    timeout_s: float

    def actor(self, index: int, bundle: int) -> _Worker:
        options = bundle_options(self.resources, self.pg, bundle, self.concurrency)
        actor = ray.remote(RolloutWorker).options(**options).remote(index, *self.init_args)
        return _Worker(index, actor, bundle)

    async def start(self, workers: list[_Worker], write: Callable[[str], None]) -> None:
        """Start ``workers``' gateways and zygotes (up to ``timeout_s``); where each went, on the console."""
        agent, sandbox_json, logs, kwargs_json, gateway_json = self.start_args
        starts = [w.actor.start.remote(agent, sandbox_json, f"{logs}/worker-{w.index}", kwargs_json, gateway_json) for w in workers]
        infos = await asyncio.wait_for(asyncio.gather(*starts), self.timeout_s)
        for w, info in zip(workers, map(json.loads, infos)):
            w.node_id, w.ip = info["node_id"], info["ip"]
            write(f"[cluster] {w.name}")
            for warning in info["warnings"]:
                write(f"[sandbox] warning ({w.name}): {warning}")


class RayRunner:
    """The ``EpisodeRunner`` over the run's rollout workers; ``start`` places them, ``close`` removes them."""

    def __init__(
        self, workers: list[_Worker], spawner: _Spawner, door: asyncio.Task | None, config: ClusterConfig, write: Callable[[str], None]
    ) -> None:
        self.workers, self.spawner, self.pg, self.door, self.write = workers, spawner, spawner.pg, door, write
        self.slots, self.replacements_left = config.slots_per_worker, config.max_worker_replacements
        self.owns_sessions = door is None  # each worker's own gateway records its sessions (run_session)
        self.freed = asyncio.Event()  # set whenever a slot frees, a worker is lost or joins: waiters look again
        self.lost_ids: set[str] = set()
        self.replacing: set[asyncio.Task] = set()  # replacements being started
        self.next_index = len(workers)

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
        own_gateway: WorkerGatewaySpec | None = None,
    ) -> RayRunner:
        """Reserve ``cluster.rollout_workers`` bundles of ``cluster.worker_resources`` (SPREAD),
        start a worker in each and wait for its gateway and zygote. ``own_gateway``: each worker
        builds its own gateway from it; None: the controller's ``gateway`` is served on TCP to the
        workers' bridges. Ray must be initialised (the trainer's placement did it). Blocks up to
        ``placement_timeout_s``."""
        ip = ray.util.get_node_ip_address()
        door, endpoint, pg, workers = None, "", None, []
        try:
            if own_gateway is None:
                ready = asyncio.Event()
                door = asyncio.create_task(serve_zmq(gateway, f"tcp://{ip}:0", ready))
                endpoint = await _door_endpoint(gateway, door, ready, ip)
            else:
                own_gateway = dataclasses.replace(own_gateway, controller_ip=ip)
            res, n = dict(config.worker_resources), config.rollout_workers
            pg = placement_group([res] * n, strategy="SPREAD", name=f"areal-rollout-{run_id}")
            await _placed(pg, config)
            spawner = _Spawner(
                pg,
                res,
                config.slots_per_worker + 4,  # its episodes, plus stop()
                (endpoint, max_restarts),
                (
                    node_agent_spec(agent),
                    json.dumps(dataclasses.asdict(sandbox)),
                    str(Path(log_dir).resolve()),
                    json.dumps(agent_kwargs),
                    own_gateway.to_json() if own_gateway else "",
                ),
                config.placement_timeout_s,
            )
            workers = [spawner.actor(i, i) for i in range(n)]
            await spawner.start(workers, write)
            if endpoint:
                write(f"[cluster] the gateway serves the rollout workers at {endpoint}")
            else:
                write(f"[cluster] each rollout worker's own gateway calls the engines at {', '.join(own_gateway.urls)}")
            return cls(workers, spawner, door, config, write)
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
        """Run one episode on a worker (waiting for a free slot on any), its agent calling the
        controller's gateway with ``api_key``. Never raises for a lost worker: its episodes come
        back crashed; raises ``RolloutWorkersLost`` once none is left."""
        payload = json.dumps(data)
        outcome, _ = await self._dispatch(episode_id, lambda actor: actor.run_episode.remote(episode_id, payload, api_key, deadline_s))
        return outcome

    async def run_session(
        self, episode_id: str, data: dict, deadline_s: float, temperature: float | None = None
    ) -> tuple[EpisodeOutcome, Session]:
        """Run one episode on a worker in a session of the worker's own gateway
        (``owns_sessions``); the outcome and the session as recorded there (an empty one when
        the worker was lost with it). Raises as ``run_episode``."""
        payload = json.dumps(data)
        outcome, record = await self._dispatch(
            episode_id, lambda actor: actor.run_session.remote(episode_id, payload, deadline_s, temperature), _episode_decoder
        )
        session = Session(key="", episode_id=episode_id, temperature=temperature)
        if record is not None:
            session.interactions = record.interactions
            session.index.drift = record.drift
        return outcome, session

    async def _dispatch(
        self, episode_id: str, call: Callable[[Any], Any], decoder: msgspec.msgpack.Decoder | None = None
    ) -> tuple[EpisodeOutcome, WorkerEpisode | None]:
        """``call(actor)`` on the least-loaded live worker with a free slot; its outcome (and the
        ``WorkerEpisode`` when ``decoder`` decodes one), a lost worker's named."""
        while (worker := self._pick()) is None:
            if not self.live and not self.replacing:
                raise RolloutWorkersLost("every rollout worker was lost: " + "; ".join(f"{w.name}: {w.dead}" for w in self.workers))
            self.freed.clear()
            await self.freed.wait()
        worker.load += 1  # no await between the pick and this: the loop is ours
        worker.episodes += 1
        ref = call(worker.actor)
        record = None
        try:
            if decoder is None:
                outcome = _decoder.decode(await ref)
            else:
                record = decoder.decode(await ref)
                outcome = record.outcome
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
        return outcome, record

    def lost(self, outcome: EpisodeOutcome) -> bool:
        """Whether ``outcome`` crashed because its worker (or the worker's zygote) died under it:
        an infrastructure failure whose group the controller runs again."""
        return outcome.episode_id in self.lost_ids

    def _drop(self, worker: _Worker, why: str) -> None:
        if worker.dead:
            return
        worker.dead = why
        ray.kill(worker.actor)  # gone already with its node; alive with its zygote's restarts spent: its bundle is freed
        self.write(f"[cluster] {worker.name} was lost, {len(self.live)} of {len(self.workers)} left: {why.splitlines()[0][:300]}")
        if self.replacements_left > 0:  # before waking the waiters: with none live, they wait for it
            self.replacements_left -= 1
            self.replacing.add(asyncio.create_task(self._replace(worker)))
        self.freed.set()

    async def _replace(self, lost: _Worker) -> None:
        """A new worker in ``lost``'s bundle once Ray has placed the bundle again (on a live node
        with its resources, maybe one that joins later), waited for up to ``placement_timeout_s``;
        then it takes episodes. A replacement that cannot start is reported, and the run goes on
        without it (with no worker left, the waiting episodes raise ``RolloutWorkersLost``)."""
        worker = self.spawner.actor(self.next_index, lost.bundle)
        self.next_index += 1
        try:
            await self.spawner.start([worker], self.write)
        except (TimeoutError, ray.exceptions.RayError) as e:
            why = "no node could hold its bundle in time" if isinstance(e, TimeoutError) else f"{type(e).__name__}: {e}"
            self.write(
                f"[cluster] rollout worker {worker.index}, replacing rollout worker {lost.index}, did not start within "
                f"cluster.placement_timeout_s={self.spawner.timeout_s}s: {why.splitlines()[0][:300]}"
            )
            ray.kill(worker.actor)
        except BaseException:  # cancelled: the run is closing
            ray.kill(worker.actor)
            raise
        else:
            self.workers.append(worker)
            self.write(
                f"[cluster] rollout worker {worker.index} replaces rollout worker {lost.index}, {len(self.live)} of {len(self.workers)} live"
            )
        finally:  # out of ``replacing`` before the waiters look: with no worker left, they give up
            self.replacing.discard(asyncio.current_task())
            self.freed.set()

    async def close(self) -> None:
        """Stop every live worker (its zygote and gateway), then kill the actors and remove the group."""
        self.write("[cluster] episodes per rollout worker: " + ", ".join(f"{w.index}: {w.episodes}" for w in self.workers))
        for task in list(self.replacing):  # a replacement still starting: its actor is killed by its own cleanup
            task.cancel()
        await asyncio.gather(*self.replacing, return_exceptions=True)
        try:
            stops = [w.actor.stop.remote() for w in self.live]
            results = await asyncio.wait_for(asyncio.gather(*stops, return_exceptions=True), 30)
            for r in results:
                if isinstance(r, BaseException) and not isinstance(r, ray.exceptions.RayActorError):
                    raise r  # a worker that died meanwhile has nothing left to stop; anything else is a bug
        finally:
            _release([w.actor for w in self.workers], self.pg, self.door)
            if self.door is not None:
                with contextlib.suppress(asyncio.CancelledError):
                    await self.door


async def _door_endpoint(gateway: Gateway, door: asyncio.Task, ready: asyncio.Event, ip: str) -> str:
    """The TCP address the ``door`` task (``serve_zmq`` on ``tcp://{ip}:0``) bound, once ``ready``;
    raises why it could not bind."""
    waiter = asyncio.create_task(ready.wait())
    await asyncio.wait([door, waiter], return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()
    if door.done():
        door.result()  # it could not bind: raise why
    return next(d.address for d in gateway.doors if d.address.startswith(f"tcp://{ip}:"))


async def _placed(pg: Any, config: ClusterConfig) -> None:
    """Wait for Ray to place the rollout workers' placement group ``pg``, up to ``placement_timeout_s``."""
    try:
        await asyncio.wait_for(pg.ready(), config.placement_timeout_s)
    except TimeoutError:
        raise TimeoutError(
            f"cluster.rollout_workers={config.rollout_workers} x cluster.worker_resources={dict(config.worker_resources)}: "
            f"the Ray cluster could not hold them within cluster.placement_timeout_s={config.placement_timeout_s}s "
            f"(cluster: {ray.cluster_resources()})"
        ) from None


def _release(actors: list[ray.actor.ActorHandle], pg: Any | None, door: asyncio.Task | None) -> None:
    release(actors, pg, started_ray=False)  # Ray is the trainer's placement's to shut down
    if door is not None:
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
