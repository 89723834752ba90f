"""The inference servers a run launches: started together, watched, restarted when one dies.

    EngineFleet.start ─► N × launch (``server_launcher``: the embedded CPU engine, or
                          ``engine.launch.command``: an SGLang or vLLM server; both started by
                          areal/engine/launch.py); ports fixed from then on: the
                          trainer and the router know each server by its URL
    supervise ─► every 0.5 s: is each engine alive?
        one engine, dead ─► return why (exit status, log tail): the run stops, naming it
        one of several, dead ─► report it; router.hold(it) (its sessions move to the others);
                  relaunch on the same port from the initial weights; load the run's newest
                  version (again, until no newer one was published meanwhile); router.release
        past ``max_restarts`` deaths ─► return why

Invariants:
- A restarted engine serves no request before it holds the newest version the controller has
  seen (the router holds it out of rotation until then), so a restart never brings old weights
  back into the run. A version the trainer publishes during the catch-up may land before the
  catch-up's own and be overwritten by it; the next publish restores it (one version of extra
  staleness on that engine at most, recorded truthfully in each token's version).
- While an engine is down, the trainer's weight push skips it (connection refused) as long as
  another engine took the version (``areal.weights.disk.push_weights``).

Servers on Ray nodes (``cluster.engine_resources``) are the same fleet: its ``launch`` starts each
through an actor on its node and returns a ``RemoteEngine`` (areal/cluster/ray_engines.py), so a
restart lands on the same node and port, and a lost actor or node is that engine's death.

Not covered: servers the run did not launch (``engine.urls``): the router routes around one that
stops answering and probes it again later, but nothing restarts it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from areal.engine.client import EngineError, EngineUnavailable
from areal.engine.config import KINDS
from areal.engine.launch import EngineProcess, Launcher, command_launcher, embedded_launcher
from areal.engine.router import EngineRouter
from areal.engine.vllm import VLLM_SERVER_ENV, vllm_venv_python
from areal.process import log_tail
from areal.weights.disk import update_weights_from_disk_sync

if TYPE_CHECKING:
    from areal.engine.config import EngineConfig


def death_of(proc: EngineProcess) -> str | None:
    """Why ``proc`` is gone (its ``exit_status()``: exit status or signal, and for a server on a
    Ray node where it ran, or that its node was lost; then its log tail), or None while it runs."""
    if proc.alive():
        return None
    return f"the inference engine (pid {proc.pid}) died ({proc.exit_status()}); log tail ({proc.log_path}):\n{log_tail(proc.log_path) or '(empty)'}"


# (url, weights dir, version, timeout_s=...) -> None: one server loads a version, blocking
WeightLoader = Callable[..., None]


def server_launcher(
    cfg: EngineConfig, model_dir: Path, run_dir: Path, *, host: str = "127.0.0.1", ray_gpus: bool = False
) -> tuple[Launcher, int]:
    """How to start one server of this run, and how many. ``host``: the address the servers
    listen on; ``ray_gpus``: on a Ray node, whose bundle's GPUs Ray already set in
    CUDA_VISIBLE_DEVICES (``engine.launch.gpus`` names this host's; areal/cluster/ray_engines.py)."""
    gpus_of = (lambda index: []) if ray_gpus else cfg.launch.gpus_of
    if cfg.kind == "embedded":
        request_log = run_dir / "engine_requests.jsonl" if cfg.request_log else None
        launch = embedded_launcher(
            model_dir,
            threads=cfg.threads,
            max_batch=cfg.max_batch,
            request_log=request_log,
            host=host,
            device=cfg.device,
            dtype=cfg.dtype,
            busy_log_dir=run_dir if cfg.busy_log else None,
        )
        return launch, cfg.replicas
    if cfg.kind == "sglang":
        return command_launcher(cfg.launch.command, model_dir, cfg.launch.health_timeout_s, gpus_of=gpus_of, host=host), cfg.launch.count
    if cfg.kind == "vllm":
        fields = {"vllm_python": str(vllm_venv_python())} if "{vllm_python}" in cfg.launch.command else {}
        launch = command_launcher(
            cfg.launch.command,
            model_dir,
            cfg.launch.health_timeout_s,
            fields=fields,
            env=VLLM_SERVER_ENV,
            gpus_of=gpus_of,
            host=host,
            scratch_env="VLLM_RPC_BASE_PATH",
        )
        return launch, cfg.launch.count
    raise ValueError(f"engine.kind must be one of {KINDS}, got {cfg.kind!r}")


class EngineFleet:
    """``count`` servers started by ``launch``; ``procs[i]`` answers at ``urls[i]``."""

    def __init__(
        self, launch: Launcher, count: int, log_dir: Path, *, max_restarts: int, load_weights: WeightLoader = update_weights_from_disk_sync
    ) -> None:
        self.launch = launch
        self.load_weights = load_weights  # how a restarted server catches up (SGLang's route, or vLLM's)
        self.count = count
        self.log_dir = log_dir
        self.max_restarts = max_restarts
        self.procs: list[EngineProcess] = []
        self.urls: list[str] = []
        self.restarts = 0

    def _log_path(self, index: int) -> Path:
        return self.log_dir / ("engine.log" if index == 0 else f"engine-{index}.log")

    def _launch(self, index: int, port: int = 0) -> EngineProcess:
        return self.launch(index, port, self._log_path(index))

    def start(self) -> None:
        """Start every server; if one fails, stop the ones started and raise its error."""
        try:
            for i in range(self.count):
                self.procs.append(self._launch(i))
                self.urls.append(self.procs[-1].url)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        for proc in self.procs:
            proc.stop()

    def death(self) -> str | None:
        """The first dead engine's story, or None while all run."""
        return next((d for d in map(death_of, self.procs) if d is not None), None)

    async def supervise(self, router: EngineRouter | None, newest: Callable[[], tuple[Path, int]], report: Callable[[str], None]) -> str:
        """Watch until the fleet cannot go on; returns why. ``newest()`` is the newest published
        weights (dir, version); ``report`` gets one line per death and restart."""
        while True:
            await asyncio.sleep(0.5)
            for i, proc in enumerate(self.procs):
                death = death_of(proc)
                if death is None:
                    continue
                if self.count == 1 or router is None:
                    return death
                self.restarts += 1
                if self.restarts > self.max_restarts:
                    return f"{death}\n(engine deaths: {self.restarts}, engine.max_restarts={self.max_restarts})"
                report(
                    f"[engine] {death.split('; log tail')[0]}; restarting it on {self.urls[i]} "
                    f"({self.restarts}/{self.max_restarts}); its sessions move to the other engines (log: {proc.log_path})"
                )
                router.hold(i)
                port = int(self.urls[i].rsplit(":", 1)[1])
                try:
                    self.procs[i] = await asyncio.to_thread(self._launch, i, port)
                    version = await self._catch_up(self.urls[i], newest, self.load_weights)
                except (RuntimeError, TimeoutError, EngineError, EngineUnavailable) as e:
                    return f"{death}\nand its restart on {self.urls[i]} failed: {e}"
                router.release(i)
                report(f"[engine] {self.urls[i]} is back (pid {self.procs[i].pid}), serving version {version}")

    @staticmethod
    async def _catch_up(url: str, newest: Callable[[], tuple[Path, int]], load_weights: WeightLoader) -> int:
        """Load the newest published version on a restarted engine, again while newer ones appear
        (a version pruned under us is skipped for the next)."""
        loaded = 0
        while True:
            path, version = newest()
            if version == loaded:
                return loaded
            try:
                await asyncio.to_thread(load_weights, url, str(path), str(version), timeout_s=300)
                loaded = version
            except (EngineError, EngineUnavailable):  # a version pruned under us: retry with the next
                if newest()[1] == version:
                    raise
                continue
