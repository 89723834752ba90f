"""The rollout controller: runs the whole RL loop of one training run.

    dataset ─► admission ─► group of n_samples episodes ─► agent runner (sandbox | inline)
                 ▲   (staleness bound, ring back-pressure)        │ LLM calls
                 │                                                ▼
                 │                              gateway ─► engine (/generate)
                 │                                                │ interactions + outcome
                 │                                                ▼
       TrainerReport ◄── trainer process ◄── shared-memory ring ◄── Trajectory per ok episode
       (version ↑)         └─► /update_weights_from_disk ─► engine

Admission (asynchronous RL with a staleness bound): group g (counting accepted and in-flight
groups) may start only while ``g < (version + 1 + max_head_offpolicyness) * groups_per_step``,
where ``version`` is the trainer's latest published policy. With a bound of 0 the loop is
synchronous; with 1, the next step's rollouts overlap the current optimizer step. Groups finish
out of order, so a group that ends after others admitted a version later could still land in a
step too new for its tokens: it is not published (logged as dropped, ``stale``) and its prompt
runs again, so no trained token is older than the bound.

Failure policy: a failed episode (error, timeout, crash) is logged with its reason and its class
in ``episodes.jsonl`` and counted per class in the metrics (``areal/agent/failures.py`` decides the
class). A policy failure (the model's output made the agent fail) is trained on with
``rollout.policy_failure_reward``, in its group; an agent or infrastructure failure is not trained
on and is left out of its group, whose advantages are normalised over the rest. An episode whose
rewards lie (not finite, outside ``rollout.reward_range``, of a wrong type, or naming completions
that are not its own) is an agent failure, its error naming the bad entries: it affects neither
the other episodes of its group nor the run. A group with nothing to train on is replaced by a
new prompt, and so is a group whose rewards are all equal under ``rollout.dynamic_sampling``
(its episodes logged as dropped, never published: ``areal/controller/dapo.py``). If the first
``2 * groups_per_step`` groups all fail, the run stops with the first failure's reason rather
than spinning. A dead engine or trainer stops the run within a second,
whatever the controller is doing (the evaluation before training included), with a named error
and the tail of its log.

Around the loop, each in its own module: the engines (``areal/engine/serving.py``), the trainer
process (``areal/trainer/launch.py``) and its messages read back (``areal/controller/metrics.py``),
one agent episode from its gateway session to its settled outcome, infrastructure losses and
zygote restarts included (``areal/controller/episodes.py``), episodes as trajectories
(``areal/controller/trajectories.py``), the run's files and trackers (``areal/controller/records.py``),
its problems (``areal/controller/problems.py``), the rings' one writer with the staleness verdict
and the resume journal (``areal/controller/publish.py``) and what it settles once around the loop:
the run directory, the model, the gateway's and the sandbox's settings, a resumed run's weights
(``areal/controller/run_setup.py``). What stays here (past 600 lines) is the loop's own state, which
starting the processes, admission, groups, failure accounting and the trainer's reports all read
and write on one event loop: split, it would be one object passed around.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import functools
import os
import secrets
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, NoReturn, TypeVar

import msgspec
import zmq
import zmq.asyncio
from tqdm import tqdm

from areal.agent.failures import classify_outcome, failure_rate_exceeded, trained
from areal.agent.groups import AdvantageWatch, WorkflowGrouping
from areal.agent.spec import InlineRunner, agent_object_spec, load_reward_fn, workflow_kind
from areal.config import RolloutConfig, TrainConfig, to_dict
from areal.controller.agent_eval import AgentEvaluation
from areal.controller.branches import branch_metrics
from areal.controller.dapo import DROPPED, Dapo, DynamicSampling, Overlong
from areal.controller.episodes import Episodes, episode_calls, episode_lines, workflow_call_record
from areal.controller.evaluation import Progress, eval_label, evaluate, resolve_eval_mode
from areal.controller.metrics import step_row
from areal.controller.online import OnlineSessions, online_rollout
from areal.controller.periodic_eval import PeriodicEval, check_eval_rows
from areal.controller.problems import check_worlds, held_out_count, held_out_problems, run_reward, train_problems, user_rows
from areal.controller.publish import GroupPublisher
from areal.controller.records import RunRecords, episode_table_row, row_rewards
from areal.controller.recovery import Journal, Resume, trained_episodes
from areal.controller.run_setup import RunFailed, gateway_config, hf_model_dir, load_resumed_weights, plan_continuation, sandbox_config
from areal.controller.task_metrics import task_score, with_task_accuracy
from areal.controller.trackers import open_trackers
from areal.controller.trajectories import STALE, trajectory_from_episode, trajectory_from_row
from areal.dataset import stratified_order
from areal.engine.client import EngineClient
from areal.engine.fleet import EngineFleet
from areal.engine.router import EngineRouter
from areal.engine.serving import RunEngines, start_engines
from areal.gateway import Gateway, Session, serve_http, serve_zmq
from areal.process import owned_temp_dir, reclaim_temp_dirs, remove_partial_writes, stop_group
from areal.protocol import EpisodeOutcome, TrainerDone, TrainerFailed, TrainerReport
from areal.ring.buffer import RingWriter, reclaim_stale, ring_name
from areal.trainer.config import TrainerJob
from areal.trainer.launch import start_trainer
from areal.trainer.reports import TrainerExited, trainer_messages
from sandbox.zygote_client import Zygote

T = TypeVar("T")


class Controller:
    """One training run. ``agent`` (an object) replaces ``rollout.agent``: an ``AgentWorkflow``
    (``async run``) runs like a spec'd agent; a ``RolloutWorkflow`` (``async arun_episode(engine,
    data)``) is called once per group with the controller's engine client. ``dataset`` replaces
    the embedded train rows, ``eval_dataset`` the embedded held-out rows."""

    def __init__(
        self,
        config: TrainConfig,
        run_dir: Path,
        agent: Any | None = None,
        dataset: list[dict] | None = None,
        eval_dataset: list[dict] | None = None,
        resume: Resume | None = None,
    ):
        self.config = config = online_rollout(config)  # online: a step's sessions form one group
        self.run_dir = run_dir
        self.resume = resume  # a killed run continued (areal/controller/recovery.py), its records already cut back
        self.agent = agent
        self.workflow_kind = workflow_kind(agent) if agent is not None else "spec"
        d = config.data
        # None: the embedded task's. A workflow object scores its rows itself (AReaL's engine-level
        # workflows: the row's own fields reach its reward_fn), so its training rows need no `answer`
        self.dataset, self.eval_dataset = user_rows(d, dataset, eval_dataset, config.seed, need_answer=agent is None)
        if config.rollout.openai.mode == "online":  # the episodes are external sessions: no row to pose, none held out
            self.dataset, self.eval_dataset = [{}], None
        check_eval_rows(d.eval_every, held_out_count(self.dataset, self.eval_dataset, d.eval_size))  # data.eval_every needs held-out rows
        check_worlds(self.dataset, self.eval_dataset, config.rollout.openai.mode)  # worlds run in the sandbox only
        # single_turn or agent, and why (data.eval_mode=auto follows the run's agent)
        self.eval_mode, self.eval_mode_why = resolve_eval_mode(d.eval_mode, config.rollout.agent, RolloutConfig.agent, self.workflow_kind)
        self.periodic_eval: PeriodicEval | None = None  # evaluation during training; made at the start (it needs the engine)
        # reward=, else the tasks' own scorer when the rows are reasoning-gym tasks (areal/controller/problems.py)
        self.reward_name = run_reward(config.reward, self.dataset, config.rollout.agent if self.workflow_kind == "spec" else "")
        self.reward_fn = load_reward_fn(self.reward_name) if self.reward_name else None
        if self.reward_name != config.reward:  # chosen here, not in config.json: said once
            tqdm.write(f"[reward] the rows are reasoning-gym tasks: each reply is scored by its task's own scorer ({self.reward_name})")
        self.agent_spec = self._agent_spec(agent)  # what the zygote imports in subproc mode
        self._init_loop_state()
        trackers = open_trackers(config.logger, config.tracker, run_dir, config.experiment_name, to_dict(config), config.seed)
        self.records = RunRecords(  # episodes.jsonl, trajectories.bin, the trackers
            run_dir,
            trackers,
            save_trajectories=config.save_trajectories,
            view_record_mb=config.view_record_mb,
            steps=config.trainer.steps,
            title=f"{config.trainer.loss.upper()}: {config.experiment_name} ({config.model.path})",
        )
        # Every published trajectory no checkpoint holds yet: what a resumed run replays.
        self.journal = Journal(run_dir) if config.trainer.checkpoint_every else None
        r = config.rollout
        self.advantage_watch = AdvantageWatch(r.groups_per_step, r.n_samples, tqdm.write)
        # the rings' one writer (areal/controller/publish.py): the staleness verdict, the journal, the accepted groups
        self.publisher = GroupPublisher(
            self.records, self.journal, self.advantage_watch, r.groups_per_step, r.max_head_offpolicyness, lambda: self.failure
        )
        if resume is not None:
            self.version = resume.step
            self.publisher.accepted = resume.step * r.groups_per_step  # the checkpoint trained these
            self.records.continued(resume.step)
        self.grouping = WorkflowGrouping(agent, r.n_samples, r.deadline_s, r.reward_range) if self.workflow_kind == "rollout" else None
        # DAPO (areal/controller/dapo.py): groups of equal rewards dropped; overlong calls masked, penalised
        sampling = DynamicSampling(r.groups_per_step, r.dynamic_sampling_max_groups or 10 * r.groups_per_step, tqdm.write)
        overlong = Overlong(r.overlong_filter, r.overlong_penalty_tokens, r.overlong_penalty_factor)
        self.dapo = Dapo(sampling if r.dynamic_sampling else None, overlong)

    def _agent_spec(self, agent: Any | None) -> str:
        """What the zygote imports in subproc mode: ``rollout.agent``, or the import path of an
        AgentWorkflow object's class (an error when the sandbox cannot import it by path)."""
        if self.workflow_kind != "agent" or self.config.rollout.openai.mode != "subproc":
            return self.config.rollout.agent
        spec = agent_object_spec(agent)
        if spec is None:
            raise ValueError(
                f"rollout.openai.mode=subproc needs an agent the sandbox can import by path, and {agent!r} is not "
                "(its class takes constructor arguments or is defined inside a function); "
                "name it with rollout.agent=MODULE:ATTR or use rollout.openai.mode=inline"
            )
        return spec

    def _init_loop_state(self) -> None:
        """The loop's own state: admission counts, the failure, the engines' and trainer's news,
        and the step's window of outcomes (what reached the rings is the publisher's)."""
        self.run_id = f"{os.getpid()}{secrets.token_hex(3)}"
        self.t0 = time.monotonic()
        self.version = 0
        self.inflight_groups = 0
        self.failed_groups = 0
        self.readmit: list[tuple[str, dict]] = []  # (group id, row) of those, to run again before the next new prompt
        self.wake = asyncio.Event()
        self.failure: str | None = None
        self.fleet: EngineFleet | None = None  # the engines this run launched (embedded, or engine.launch.command)
        self.fleet_failure: str | None = None  # why the fleet could not go on (its supervisor's verdict)
        self.gateway: Gateway | None = None  # the run's gateway, once started
        self.done: TrainerDone | None = None
        self.window: list[EpisodeOutcome] = []  # outcomes since the last trainer report
        self.window_calls: list[tuple[int, int, int]] = []  # (LLM calls, tool calls, malformed calls) of each episode since then
        self.window_tasks: list[tuple[str, float]] = []  # (task, reward) of each trained episode since then whose row has a task
        r = self.config.rollout
        # The failure class of each of the last episodes ("" when not failed; infrastructure
        # failures absorbed by a restart excluded): the failure-rate stop rule reads it.
        self.recent_classes: collections.deque[str] = collections.deque(
            maxlen=r.failure_window or max(64, 2 * r.groups_per_step * r.n_samples)
        )

    # ---- the run --------------------------------------------------------------------------

    async def run(self) -> dict[str, Any]:
        finished = False
        try:
            summary = await self._run()
            finished = True
            return summary
        finally:  # the trainer has stopped: its trained-episode lists are final, nothing writes
            self.records.untrained(self.publisher.published, self.failure)
            for path in remove_partial_writes(self.run_dir):
                tqdm.write(f"[run] removed the partial write {path}")
            self.records.close(finished)
            if self.journal is not None:
                self.journal.close()
                if finished:  # nothing is left to resume
                    self.journal.path.unlink(missing_ok=True)

    async def _run(self) -> dict[str, Any]:
        """The run's steps: its processes started, the evaluation before training, the rollouts
        until the trainer's last step, the evaluation after it, the summary."""
        cfg = self.config
        for folder in reclaim_temp_dirs():  # socket folders and engine scratch of runs that were killed
            tqdm.write(f"[run] removed the stale temp folder {folder}")
        sock_dir = Path(owned_temp_dir("run"))  # ipc paths must stay short
        async with contextlib.AsyncExitStack() as stack:
            stack.callback(shutil.rmtree, sock_dir, True)
            gateway_addr = f"ipc://{sock_dir}/gateway.sock"
            engines, gateway, http_url = await self._start_serving(stack, gateway_addr)
            self.publisher.rings, trainer_proc = await self._start_trainer_side(stack, sock_dir, engines.model_dir, engines.urls)
            episodes = await self._start_runner(gateway_addr, http_url, gateway, engines.urls, engines.model_dir)
            if episodes is not None:
                stack.push_async_callback(episodes.close)
            eval_set = held_out_problems(self.dataset, self.eval_dataset, cfg.data.eval_size, cfg.seed)
            evaluate_as = self._evaluator(episodes, engines.client, self.tokenizer, eval_set)  # single-turn or the agent (data.eval_mode)
            evaluate_as = with_task_accuracy(evaluate_as, eval_set, tqdm.write)  # + accuracy per task, for rows with a task
            eval_before = await self._evaluate_before(evaluate_as, eval_set)
            if self.resume is not None and self.resume.step > 0:
                s, timeout_s = self.resume.step, cfg.trainer.engine_timeout_s
                await load_resumed_weights(self.run_dir, s, engines.urls, trainer_proc, cfg.engine.kind, timeout_s, tqdm.write)
            d = cfg.data
            self.periodic_eval = PeriodicEval(
                self.run_dir,
                self.records,
                functools.partial(evaluate_as, "periodic") if eval_set else None,
                tqdm.write,
                every=d.eval_every,
                steps=cfg.trainer.steps,
                metric=d.eval_best_metric,
                mode=d.eval_best_mode,
            )
            stack.callback(self.periodic_eval.cancel)
            problems, levels = train_problems(self.dataset, d.train_size, cfg.seed)
            await self._rollout_loop(episodes, problems, levels, engines.client)
            return await self._finish(evaluate_as, eval_set, eval_before)

    async def _start_serving(self, stack: contextlib.AsyncExitStack, gateway_addr: str) -> tuple[RunEngines, Gateway, str]:
        """The model's tokenizer, the engines (launched, a launched fleet supervised, or reached) and
        the gateway in front of them, serving the sandboxes at ``gateway_addr`` (ZeroMQ) and inline
        agents over HTTP; ``stack`` stops them. Returns the engines, the gateway, its HTTP URL."""
        cfg, model_dir = self.config, hf_model_dir(self.config.model.path)
        from transformers import AutoTokenizer

        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.records.vocabulary(self.tokenizer)  # vocab.json: the viewer decodes without the model
        place = None
        if cfg.cluster.engine_resources:  # each launched server on a Ray node of its own
            from areal.cluster.ray_engines import RayEnginePlacement

            place = functools.partial(RayEnginePlacement.place, cfg.cluster, self.run_id, cfg.engine, run_dir=self.run_dir)
        engines = await start_engines(cfg.engine, model_dir, self.run_dir, stack, tqdm.write, place)  # its model_dir: what they serve
        self.fleet = engines.fleet
        if self.fleet is not None:
            supervisor = asyncio.create_task(self._supervise(self.fleet, engines.router, engines.model_dir))
            stack.callback(supervisor.cancel)  # before the engines' own stop (callbacks run last-in first)
        gateway = Gateway(engines.client, self.tokenizer, gateway_config(cfg.gateway, engines.model_dir, tqdm.write))
        gateway.branching = cfg.rollout.branch  # off unless rollout.branch.n >= 2 (docs/branching.md)
        self.gateway = gateway
        if self.grouping is not None:  # ArealOpenAI clients of the workflow keep the run's limits
            self.grouping.gateway_config = gateway.config
        zmq_task = asyncio.create_task(serve_zmq(gateway, gateway_addr))
        stack.callback(zmq_task.cancel)
        http_runner, http_url = await serve_http(gateway, cfg.rollout.openai.online_host, cfg.rollout.openai.online_port)
        stack.push_async_callback(http_runner.cleanup)
        if self.grouping is not None:  # a workflow's own HTTP clients (AReaL's engine.addresses) reach it there
            self.grouping.door = (gateway, http_url)
        return engines, gateway, http_url

    async def _start_trainer_side(
        self, stack: contextlib.AsyncExitStack, sock_dir: Path, model_dir: Path, urls: list[str]
    ) -> tuple[list[RingWriter], subprocess.Popen]:
        """The rings (one per trainer rank; whole groups go round-robin, so each rank gets its share)
        and the trainer reading them: here, or on Ray nodes (cluster.kind=ray, the rings fed over
        TCP: areal/cluster/ray_trainer.py). Its reports are listened to from its start: its death
        stops the run within a second, whatever the run does meanwhile."""
        cfg = self.config
        for name in reclaim_stale("areal-"):  # segments of runs that crashed before unlinking
            tqdm.write(f"[ring] removed stale shared-memory segment {name}")
        pull = zmq.asyncio.Context.instance().socket(zmq.PULL)
        stack.callback(pull.close, 0)
        if cfg.cluster.kind == "ray":
            from areal.cluster.ray_trainer import RayTrainerPlacement

            placement = await asyncio.to_thread(
                RayTrainerPlacement.place, cfg.cluster, self.run_id, cfg.trainer.ranks, cfg.ring_capacity_mb << 20
            )
            stack.callback(placement.close)
            for line in placement.placed():  # one per trainer node (cluster.trainer_nodes)
                tqdm.write(f"[cluster] {line}")
            rings = placement.rings  # same surface as a RingWriter's for the publisher
            report_addr = placement.bind_report(pull)
            trainer_proc = self._start_trainer(model_dir, [r.name for r in rings], urls, report_addr, placement.start_trainer)
        else:
            rings = []
            for rank in range(cfg.trainer.ranks):
                rings.append(RingWriter(ring_name(self.run_id, rank), cfg.ring_capacity_mb << 20))
                stack.callback(rings[-1].close, unlink=True)
            pull.bind(f"ipc://{sock_dir}/trainer.sock")
            trainer_proc = self._start_trainer(model_dir, [r.name for r in rings], urls, f"ipc://{sock_dir}/trainer.sock")
            stack.callback(stop_group, trainer_proc, 5.0)
        listener = asyncio.create_task(self._listen(pull, trainer_proc))
        stack.callback(listener.cancel)
        return rings, trainer_proc

    async def _evaluate_before(
        self, evaluate_as: Callable[[str], Awaitable[dict[str, Any]]], eval_set: list[dict]
    ) -> dict[str, Any] | None:
        """The initial weights scored once per run: a resumed run reads the score its first start
        saved (the engines load the checkpoint's weights after it), unless the evaluation's mode
        changed since. The trainer waits for its first records meanwhile, however long this takes:
        its wait lasts while the controller (the rings' writer) lives (areal/trainer/step.py)."""
        eval_before = self.records.saved_eval_before() if self.resume is not None else None
        if eval_before is not None and eval_before.get("mode", "single_turn") != self.eval_mode:
            eval_before = None  # scored the other way (data.eval_mode changed): scored again, the initial weights still served
        if eval_set:
            tqdm.write(f"[eval] {len(eval_set)} held-out problems; {self.eval_mode_why}")
        elif self.dataset is not None and self.config.rollout.openai.mode != "online" and self.config.data.eval_size:
            tqdm.write("[eval] none: the training rows came without held-out ones (data.eval names them)")
        if eval_before is not None:
            tqdm.write(f"held-out accuracy before training (from the run's first start): {eval_before['sampled_acc']:.3f} (sampled)")
        elif eval_set:  # the evaluation's summary line says what it scored and what it cost
            eval_before = await self._unless_stopped(evaluate_as("before"))
            self.records.evaluation("before", eval_before, 0)
        return eval_before

    async def _finish(
        self, evaluate_as: Callable[[str], Awaitable[dict[str, Any]]], eval_set: list[dict], eval_before: dict[str, Any] | None
    ) -> dict[str, Any]:
        """After the rollouts: the trainer's last step (or the run's failure), the evaluation during
        training still in flight, then the "after" evaluation, the best step, the summary."""
        while self.done is None and self.failure is None:
            await self._wait()
        if self.failure:
            await self._raise_failure()
        await self.periodic_eval.drain()  # not beside the "after" evaluation
        eval_after = await self._unless_stopped(evaluate_as("after")) if eval_set else None  # an engine may still die
        if eval_after:
            self.records.evaluation("after", eval_after, self.version)
        best = self.periodic_eval.after(eval_after, self.version, self.done.model_dir)  # the last step's candidacy
        return self.records.summary(self.done.model_dir, eval_before, eval_after, time.monotonic() - self.t0, best=best)

    async def _start_runner(self, gateway_addr: str, http_url: str, gateway: Gateway, urls: list[str], model_dir: Path) -> Episodes | None:
        """The agent runner, as the run's episodes use it (areal/controller/episodes.py says what each kind
        brings): the sandbox zygote (subproc), zygotes on Ray nodes (``cluster.rollout_workers``,
        each with its own gateway on the engines at ``urls`` unless ``cluster.gateway=controller``),
        the inline runner, or None for a RolloutWorkflow object, which the rollout loop calls itself
        with ``engine``."""
        cfg = self.config
        if self.workflow_kind == "rollout":
            if cfg.cluster.rollout_workers:
                raise ValueError("cluster.rollout_workers runs sandboxed agents; a RolloutWorkflow object runs in the controller")
            return None
        episodes = functools.partial(
            Episodes,
            gateway=gateway,
            rollout=cfg.rollout,
            reward_fn=self.reward_fn,
            reward_name=self.reward_name,
            tokenizer=self.tokenizer,
            write=tqdm.write,
            fail=self._fail,
        )
        if cfg.rollout.openai.mode == "online":  # areal/controller/online.py
            o = cfg.rollout.openai
            online = OnlineSessions(gateway, o.online_claim_s, tqdm.write, scored=self.reward_fn is not None, generation=o.online_gateway)
            online.announce(http_url)
            return episodes(online, run_session=online.run_session)
        if cfg.rollout.openai.mode == "subproc" and cfg.cluster.rollout_workers:  # areal/cluster/ray_rollout.py
            from areal.cluster.ray_rollout import RayRunner, WorkerGatewaySpec

            sandbox, log_dir = sandbox_config(cfg.sandbox, self.run_dir), self.run_dir / "sandbox"
            r = cfg.rollout
            own = None
            if cfg.cluster.gateway == "worker":
                own = WorkerGatewaySpec(str(Path(model_dir).resolve()), cfg.engine.kind, list(urls), dataclasses.asdict(gateway.config))
            workers = await RayRunner.start(
                cfg.cluster, gateway, self.agent_spec, sandbox, log_dir, r.agent_kwargs, r.max_zygote_restarts, self.run_id, tqdm.write, own
            )
            return episodes(workers, run_session=workers.run_session if workers.owns_sessions else None, lost=workers.lost)
        if cfg.rollout.openai.mode == "subproc":
            sandbox, sandbox_logs = sandbox_config(cfg.sandbox, self.run_dir), str(self.run_dir / "sandbox")
            zygote = await Zygote.start(self.agent_spec, gateway_addr, sandbox, sandbox_logs, cfg.rollout.agent_kwargs)
            for w in zygote.ready.warnings:
                tqdm.write(f"[sandbox] warning: {w}")
            zygote.on_warning = lambda w: tqdm.write(f"[sandbox] warning: {w}")
            return episodes(zygote, zygote=zygote)
        if self.agent is not None:
            return episodes(InlineRunner(self.agent, http_url))
        return episodes(InlineRunner(cfg.rollout.agent, http_url, cfg.rollout.agent_kwargs))

    def _start_trainer(
        self, model_dir: Path, rings: list[str], urls: list[str], report_addr: str, start: Callable[[TrainerJob, Path], Any] = start_trainer
    ) -> subprocess.Popen:
        cfg = self.config
        job = TrainerJob(
            model_path=str(model_dir),
            ring_name=rings[0],
            ring_names=rings if len(rings) > 1 else [],
            engine_urls=urls,
            report_addr=report_addr,
            run_dir=str(self.run_dir),
            groups_per_step=cfg.rollout.groups_per_step,
            temperature=cfg.rollout.temperature,
            seed=cfg.seed,
            trainer=cfg.trainer,
            engine_kind=cfg.engine.kind,
            resume_from=str(self.resume.checkpoint) if self.resume is not None and self.resume.checkpoint else "",
            journaled=self.journal is not None,
        )
        return start(job, self.run_dir)  # start_trainer here, or on a Ray node (RayTrainerPlacement.start_trainer)

    # ---- rollouts -------------------------------------------------------------------------

    async def _rollout_loop(
        self,
        episodes: Episodes | None,
        problems: list[dict],
        levels: list[int],
        engine: EngineClient | EngineRouter | None = None,
    ) -> None:
        cfg = self.config.rollout
        total = self.config.trainer.steps * cfg.groups_per_step
        order = stratified_order(levels, cfg.groups_per_step, self.config.seed)
        next_prompt = 0
        rerun: list[tuple[int, str]] = []  # a resumed run's lost groups: (prompt position, group id), first
        tag = ""
        if self.resume is not None:
            await self.publisher.replay(self.resume.replay, tqdm.write)
            rerun, next_prompt, tag = list(self.resume.readmit), self.resume.next_position, f"-resume{self.resume.attempt}"
        tasks: set[asyncio.Task] = set()
        try:
            while self.publisher.accepted < total:
                if self.failure:
                    break
                while self.publisher.accepted + self.inflight_groups < min(
                    total, (self.version + 1 + cfg.max_head_offpolicyness) * cfg.groups_per_step
                ) and (self.inflight_groups + 1) * cfg.n_samples <= max(cfg.max_concurrent_episodes, cfg.n_samples):
                    if self.readmit:  # a group that finished too late for the bound: its prompt again
                        group_id, problem = self.readmit.pop(0)
                    elif rerun:
                        position, group_id = rerun.pop(0)
                        problem = problems[order[position % len(order)]]
                        group_id = (
                            group_id or f"g{position}-p{order[position % len(order)]}"
                        )  # admitted, but no episode of it ended before the kill
                    else:
                        idx = order[next_prompt % len(order)]
                        group_id, problem = f"g{next_prompt}-p{idx}", problems[idx]
                        next_prompt += 1
                    self.inflight_groups += 1
                    if self.workflow_kind == "rollout":
                        group = self._run_workflow_group(engine, group_id, problem)
                    else:
                        group = self._run_group(episodes, group_id, problem, tag)
                    task = asyncio.create_task(group)
                    tasks.add(task)
                    task.add_done_callback(self._group_done)
                    task.add_done_callback(tasks.discard)
                await self._wait()
        finally:
            # Also on Ctrl-C / SIGTERM (cancellation): no episode may outlive the loop and keep
            # the gateway and engine busy while the run shuts down.
            for t in list(tasks):
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _group_done(self, task: asyncio.Task) -> None:
        self.inflight_groups -= 1
        if not task.cancelled() and task.exception() is not None and self.failure is None:
            self.failure = f"rollout group failed: {task.exception()!r}"
        self.wake.set()

    async def _run_group(self, episodes: Episodes, group_id: str, problem: dict, tag: str = "") -> None:
        """Run one group; a group cut short by the infrastructure (the sandbox zygote died, a Ray
        rollout worker was lost: ``Episodes.lost``) is logged and run again (same prompt, new
        episode ids) once the runner is whole. ``tag`` marks the episode ids of a resumed run
        (``-resume<n>``), which may run a group of the killed run again."""
        n, last = self.config.rollout.n_samples, self.config.rollout.max_zygote_restarts
        for attempt in range(last + 1):
            mark = episodes.generation
            prefix = group_id + tag if attempt == 0 else f"{group_id}{tag}-retry{attempt}"
            results = await asyncio.gather(*(self._run_episode(episodes, f"{prefix}-e{i}", problem, group_id) for i in range(n)))
            if not episodes.lost([o for o, _ in results], mark):
                break
            results = [
                (
                    msgspec.structs.replace(o, error=f"infrastructure failure, group re-admitted: {o.error}")
                    if o.status == "crashed"
                    else o,
                    s,
                )
                for o, s in results
            ]
            recovered = await episodes.recover(next(o.error for o, _ in results if o.status == "crashed"))
            if recovered and attempt == last:  # no attempt left: the group is what this one trained
                break
            for o, s in results:
                self._log_episode(o, s, group_id, problem=problem)
            if not recovered:
                return
        self._count_failures([o for o, _ in results])
        # Trained: ok episodes and policy failures (with policy_failure_reward), and reward hacks under
        # rollout.reward_hack=penalty, each with the completions the gateway recorded; agent and
        # infrastructure failures (and excluded reward hacks) leave the group.
        good = [(o, s) for o, s in results if trained(o, self.config.rollout.reward_hack) and s.interactions]
        trajectories = [trajectory_from_episode(o, s, group_id, len(good), self.dapo.overlong) for o, s in good]
        dropped = bool(good) and self.dapo.drop(trajectories, self.publisher.accepted)  # logged with its episodes, then not published
        kept = {o.episode_id for o, _ in good}

        def log(mark: str) -> None:  # episodes.jsonl: why the episodes with something to train on were not published
            for o, s in results:
                self._log_episode(o, s, group_id, mark if o.episode_id in kept else "", problem)

        if not good or dropped:
            log(DROPPED if dropped else "")
            if not good:
                self._group_failed(results[0][0])
            return
        if await self.publisher.publish(trajectories, log=log):
            self.dapo.published([i for _, s in good for i in s.interactions.values()])
        else:
            self.readmit.append((f"{group_id}-{STALE}", problem))

    async def _run_workflow_group(self, engine: EngineClient | EngineRouter, group_id: str, problem: dict) -> None:
        """One group of ``arun_episode`` calls (``areal/agent/groups.py`` decides how many):
        each call gets its line in episodes.jsonl; each row of the ok calls is one Trajectory, all
        normalised together (group_size = rows); no rows at all fails the group."""
        calls = await self.grouping.run_group(engine, problem, group_id)
        # A call's rows are exported only when it returned: a failed one has nothing to train.
        outcomes = [classify_outcome(c.outcome, bool(c.rows), self.config.rollout.failure_classes) for c in calls]
        self._count_failures(outcomes)
        rows = [row for c in calls for row in c.rows.values()]
        trajectories = [trajectory_from_row(row, f"{group_id}-r{i}", group_id, len(rows), self.dapo.overlong) for i, row in enumerate(rows)]
        dropped = bool(rows) and self.dapo.drop(trajectories, self.publisher.accepted)

        def log(mark: str) -> None:
            for c, outcome in zip(calls, outcomes):
                self.window.append(outcome)
                record = workflow_call_record(c, outcome, group_id)
                if mark and c.rows:
                    record["dropped"] = mark
                inters = [r.interaction for r in c.rows.values()]
                rewards = {r.interaction.id: (r.interaction.reward, r.reward) for r in c.rows.values()}
                self.records.episode(record, functools.partial(episode_table_row, self._decode, record, inters), inters, rewards)

        if not rows or dropped:
            log(DROPPED if dropped else "")
            if not rows:
                self._group_failed(outcomes[0])
            return
        if await self.publisher.publish(trajectories, log=log):
            self.dapo.published([row.interaction for row in rows])
        else:
            self.readmit.append((f"{group_id}-{STALE}", problem))

    def _count_failures(self, outcomes: list[EpisodeOutcome]) -> None:
        """Feed the failure-rate window (``failure_rate_exceeded``); its verdict, the first time
        there is one, is the run's failure."""
        why = failure_rate_exceeded(self.recent_classes, outcomes, self.config.rollout.max_failure_rate)
        if why and self.failure is None:
            self.failure = why

    def _engine_death(self) -> str | None:
        """What ended the run's engines (None while they serve, or when the run launched none):
        the fleet supervisor's verdict, or the death of a lone engine it has not seen yet."""
        if self.fleet is None:
            return None
        return self.fleet_failure or (self.fleet.death() if self.fleet.count == 1 else None)

    async def _settle_engine_death(self, wait_s: float = 1.0) -> None:
        """Give a killed engine's exit a moment to become visible: its sockets are reset before
        the kernel lets its parent reap it, so a failure caused by the death (a reset weight push
        or request) can arrive first, and the run must still name the death as the cause."""
        deadline = time.monotonic() + wait_s
        while self.fleet is not None and self._engine_death() is None and time.monotonic() < deadline:
            await asyncio.sleep(0.05)

    def _with_engine_death(self, failure: str) -> str:
        """``failure``, led by the engine's death when the engine died: a trainer's weight push or
        an episode's 503 that failed because of it is a consequence, not the cause."""
        death = self._engine_death()
        if death is None or failure.startswith(death):
            return failure
        return f"{death}\nthen: {failure}" if failure else death

    async def _supervise(self, fleet: EngineFleet, router: EngineRouter | None, model_dir: Path) -> None:
        """Notice an engine's death within half a second, whatever the trainer or the rollouts are
        doing (waiting for data, pushing weights, evaluating): one of several is restarted at the
        newest version (``areal.engine.fleet``); a lone one, or too many deaths, stop the run."""

        def newest() -> tuple[Path, int]:
            return (self.run_dir / "weights" / f"v{self.version}", self.version) if self.version else (model_dir, 0)

        self.fleet_failure = await fleet.supervise(router, newest, tqdm.write)
        self.failure = self._with_engine_death(self.failure or "")
        self.wake.set()

    async def _raise_failure(self) -> NoReturn:
        """Stop the run with its failure (``RunFailed``), led by an engine's death when one died."""
        await self._settle_engine_death()
        raise RunFailed(self._with_engine_death(self.failure or "the run failed"))

    async def _unless_stopped(self, work: Awaitable[T]) -> T:
        """``work``'s result, unless the run fails first: the trainer's listener and the engines'
        supervisor set ``failure`` within a second of a death, and the controller's own long work
        outside the rollout loop (the evaluations before and after training) must not outlast
        it. Then ``work`` is cancelled and the run stops with that failure."""
        task = asyncio.ensure_future(work)
        try:
            while not task.done() and self.failure is None:
                await asyncio.wait({task}, timeout=0.5)
        finally:
            task.cancel()  # a no-op once it is done
            await asyncio.gather(task, return_exceptions=True)  # its error, if any, retrieved (the failure comes first)
        if self.failure is not None:
            await self._raise_failure()
        return task.result()

    def _fail(self, why: str) -> None:
        """Stop the run with ``why``, unless it is stopping already (the first reason stands)."""
        self.failure = self.failure or why

    def _group_failed(self, first: EpisodeOutcome) -> None:
        self.failed_groups += 1
        if self.publisher.accepted == 0 and self.failed_groups >= 2 * self.config.rollout.groups_per_step:
            self.failure = (
                f"the first {self.failed_groups} groups all failed; first episode: {first.failure_class or 'no'} failure "
                f"({first.failure_cause}): status={first.status} error={first.error[-2000:] or 'no interactions recorded'}"
            )

    async def _run_episode(self, episodes: Episodes, episode_id: str, problem: dict, group_id: str) -> tuple[EpisodeOutcome, Session]:
        """One training episode, settled and added to the step's window; cancelled (the run is
        stopping), it still gets its one line in episodes.jsonl."""
        t0 = time.monotonic()

        def cancelled(session: Session) -> None:
            why = self.failure or "the run was stopped (interrupted, or it ended with episodes in flight)"
            cut = EpisodeOutcome(episode_id, "cancelled", error=f"cancelled before it finished: {why[:2000]}", wall_s=time.monotonic() - t0)
            self._log_episode(classify_outcome(cut, bool(session.interactions)), session, group_id, problem=problem)

        # sampled at rollout.temperature whatever the agent asks: the trainer scores its tokens at that one
        outcome, session = await episodes.run(episode_id, problem, self.config.rollout.temperature, cancelled=cancelled)
        outcome, session = await episodes.settle_episode(outcome, session, problem)  # branched: its tree session
        self.window.append(outcome)
        if (scored := task_score(problem, outcome, session.interactions.values())) is not None:
            self.window_tasks.append(scored)
        return outcome, session

    def _evaluator(
        self, episodes: Episodes | None, engine: Any, tokenizer: Any, eval_set: list[dict]
    ) -> Callable[[str], Awaitable[dict[str, Any]]]:
        """The held-out evaluation, called by name (before, periodic, after): one reply per problem
        straight on the engine (single_turn, areal/controller/evaluation.py), or the run's own agent's
        episodes (agent, areal/controller/agent_eval.py: ``Episodes.evaluate``); ``self.eval_mode``."""
        d = self.config.data
        if self.eval_mode == "agent":
            log_path = self.run_dir / "eval_episodes.jsonl"
            limit = self.config.rollout.max_concurrent_episodes
            run = episodes.evaluate
            return AgentEvaluation(
                run, eval_set, d.eval_samples, d.eval_temperature, limit, log_path, self._decode, lambda: self.version, tqdm.write
            )
        temperature = self.config.rollout.temperature if d.eval_temperature is None else d.eval_temperature

        async def single_turn(name: str) -> dict[str, Any]:
            n, k = len(eval_set), d.eval_samples
            detail = f"one reply per question: {n} problems x {k} sampled + 1 greedy"
            progress = Progress(eval_label(name, self.version), n * (k + 1), "replies", tqdm.write, detail)
            async with progress.beating():
                result = await evaluate(engine, tokenizer, eval_set, temperature, k, reward_fn=self.reward_fn, progress=progress)
            progress.finish(result, f"scored by reward={self.reward_name}" if self.reward_fn else "scored by the \\boxed{} answer check")
            return result

        return single_turn

    def _log_episode(self, o: EpisodeOutcome, s: Session, group_id: str, dropped: str = "", problem: dict | None = None) -> None:
        """The episode's line in episodes.jsonl (a branched episode's: one per branch); ``dropped``: why
        an episode with something to train on was not published (``"dynamic_sampling"``), else ""
        (no key); ``problem``: its row."""
        self.window_calls.append(episode_calls(s))
        for record, outcome, inters in episode_lines(o, s, group_id, problem):
            if dropped:
                record["dropped"] = dropped
            table_row = functools.partial(episode_table_row, self._decode, record, inters)
            self.records.episode(record, table_row, inters, row_rewards(outcome, inters))

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids)  # the tokenizer is loaded when the run starts

    # ---- trainer reports ------------------------------------------------------------------

    async def _listen(self, pull: zmq.asyncio.Socket, proc: subprocess.Popen) -> None:
        bar = tqdm(total=self.config.trainer.steps, desc="train", unit="step", dynamic_ncols=True)
        try:
            async for message in trainer_messages(pull, proc, self.run_dir):
                match message:
                    case TrainerReport() as r:
                        self.version = r.version
                        self._record_step(r)
                        every = self.config.trainer.checkpoint_every
                        if self.journal is not None and r.step % every == 0:  # checkpoint r.step is complete
                            await self.publisher.compact(trained_episodes(self.run_dir, r.step))
                        if self.periodic_eval is not None:  # data.eval_every: evaluate v{step} beside the rollouts
                            self.periodic_eval.on_report(r.step, r.version)
                        bar.set_postfix(reward=f"{r.metrics.get('reward_mean', float('nan')):.3f}", v=r.version)
                        bar.update(1)
                    case TrainerFailed() as f:
                        self.failure = f"trainer rank {f.rank} failed:\n{f.error}"
                    case TrainerDone() as d:
                        self.done = d
                    case TrainerExited(reason=why):  # the last message
                        self.failure = why
                self.wake.set()
        finally:
            bar.close()

    def _record_step(self, r: TrainerReport) -> None:
        window, self.window = self.window, []
        calls, self.window_calls = self.window_calls, []
        tasks, self.window_tasks = self.window_tasks, []
        stale = self.publisher.take_stale()
        # DAPO's counts since the last step; the groups that finished too late for the staleness bound (run again)
        row = {**step_row(r, window, calls, tasks), **self.dapo.take_metrics(), "stale_groups": stale}
        self.records.step({**row, **branch_metrics(self.gateway)})  # rollout.branch: branch sessions left open

    async def _wait(self) -> None:
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self.wake.wait(), 1.0)
        self.wake.clear()


async def train(
    config: TrainConfig,
    run_dir: Path,
    *,
    agent: Any | None = None,
    dataset: list[dict] | None = None,
    eval_dataset: list[dict] | None = None,
) -> dict[str, Any]:
    """Run one training run in ``run_dir``; returns its summary (also ``summary.json``).

    ``agent``: an object replacing ``rollout.agent`` (``async run(data, **extra_kwargs)``, or a
    RolloutWorkflow's ``async arun_episode(engine, data)``). ``dataset`` / ``eval_dataset``: rows
    ({question|messages, answer}) replacing the embedded train / held-out problems. A directory
    holding a killed run continues it (``recover.mode=auto``, areal/controller/recovery.py).
    """
    run_dir.mkdir(parents=True, exist_ok=True)
    resume = plan_continuation(config.recover.mode, config.rollout.n_samples, run_dir, tqdm.write)
    return await Controller(config, run_dir, agent=agent, dataset=dataset, eval_dataset=eval_dataset, resume=resume).run()
