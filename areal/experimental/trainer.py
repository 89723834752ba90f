"""``PPOTrainer``: AReaL's trainer entry, a thin layer over ``areal.controller.loop.train``.

    with PPOTrainer(config, train_dataset=, valid_dataset=) as trainer:
        trainer.train(workflow, eval_workflow)
            │  to_train_config(config, ...)  AReaL keys ─► areal.config.TrainConfig
            │  workflow ─► an agent spec "MODULE:ATTR" or ".py:ATTR" (runs sandboxed or inline)
            │            └► an object (AgentWorkflow / RolloutWorkflow) handed over as ``agent=``
            ▼
        areal.aio.run(areal.controller.loop.train(train_config, run_dir, **extra))  ─► summary dict

Workflows, and where they run:
- a string path (``"areal.workflow.openai.math_agent.MathAgent"``) or a class: becomes the agent
  spec ``rollout.agent``; the zygote (``subproc``) or the controller (``inline``) builds it.
- an ``AgentWorkflow`` object: if its class is importable (a module, or the running script by
  file path) and takes no constructor arguments, it becomes that class's spec, so it runs in
  either mode; otherwise it is passed as ``agent=`` and needs ``rollout.openai.mode=inline``.
- a ``RolloutWorkflow`` (``arun_episode(engine, data)``; a class is built with ``workflow_kwargs``):
  passed as ``agent=`` inside a ``RecordedWorkflow`` (areal/api/engine_api.py), so its ``engine``
  is AReaL's (``agenerate``, ``get_version``, ``config``) and what it returns, recorded rows or
  AReaL's tensor dict, is trained as recorded; it runs in the controller's event loop whatever the mode.

Datasets: the embedded task (``EmbeddedDataset``) maps onto ``data.train_size`` / ``eval_size``;
any other rows go to the controller as ``dataset=`` / ``eval_dataset=``.

Not covered: ``eval_workflow`` is accepted for AReaL compatibility but held-out evaluation is the
controller's own (``areal.controller.evaluation``: greedy and sampled accuracy before and after training).
The run directory is ``<cluster.fileroot>/<experiment_name>/<trial_name>``.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import math
from pathlib import Path
from typing import Any

from areal.agent.spec import class_spec
from areal.aio import run as run_loop
from areal.api.cli_args import InferenceEngineConfig, PPOConfig
from areal.api.engine_api import RecordedWorkflow
from areal.api.workflow_api import workflow_kind
from areal.config import DataConfig, TrainConfig, to_dict
from areal.dataclass_config import build_dataclass
from areal.dataset import EmbeddedDataset
from areal.gateway import GatewayConfig
from areal.utils.dynamic_import import import_from_string


@dataclasses.dataclass
class WorkflowPlan:
    """How a workflow reaches the controller: an agent spec, or an object (needs ``agent=``)."""

    spec: str | None
    obj: Any | None
    kind: str  # "agent" | "rollout"
    kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)  # what the spec's class is built with


def plan_workflow(
    workflow: Any, workflow_kwargs: dict[str, Any] | None = None, rollout: InferenceEngineConfig | None = None
) -> WorkflowPlan:
    """Decide how ``workflow`` (a path, a class or an object) is handed to the controller.

    A ``RolloutWorkflow`` is always an object, a ``RecordedWorkflow`` around it: it gets AReaL's
    engine (``agenerate``, ``config``: ``rollout``) and its rows become the recorded ones.

    An agent class named with ``workflow_kwargs`` (AReaL's ``train.py`` passes temperature,
    top_p, max_tokens, max_completion_tokens, max_turns) is built with them wherever it runs: as a
    spec plus ``rollout.agent_kwargs`` when they are JSON values, else as an object built here."""
    kwargs = dict(workflow_kwargs or {})
    if isinstance(workflow, str):
        workflow = import_from_string(workflow)
    if inspect.isclass(workflow):
        spec = class_spec(workflow) if not kwargs or _json_values(kwargs) else None
        if spec is not None and workflow_kind(workflow) == "agent":
            workflow(**kwargs)  # fail here, naming the class, not in every sandboxed episode
            return WorkflowPlan(spec, None, "agent", kwargs)
        workflow = workflow(**kwargs)
    elif kwargs:
        raise ValueError("workflow_kwargs apply only when the workflow is given as a class or an import path")
    kind = workflow_kind(workflow)
    if kind == "agent" and not kwargs and not inspect.isfunction(workflow) and class_spec(type(workflow)) is not None:
        return WorkflowPlan(class_spec(type(workflow)), None, kind)
    if kind == "rollout":  # its engine: a GatewayEngine over the run's, recording every agenerate
        return WorkflowPlan(None, RecordedWorkflow(workflow, rollout), kind)
    return WorkflowPlan(None, workflow, kind)


def _json_values(kwargs: dict[str, Any]) -> bool:
    try:
        return json.loads(json.dumps(kwargs)) == kwargs
    except (TypeError, ValueError):
        return False


def train_steps(config: PPOConfig, n_rows: int) -> int:
    """``total_train_steps``, else epochs × ceil(rows / batch_size)."""
    if config.total_train_steps is not None:
        return config.total_train_steps
    return config.total_train_epochs * max(1, math.ceil(n_rows / config.train_dataset.batch_size))


def without_evaluation(tcfg: TrainConfig) -> TrainConfig:
    """A run given no valid_dataset evaluates nothing during training, as AReaL (which evaluates
    only the valid_dataset it is handed; its countdown script hands none) does, where this system
    would refuse ``evaluator.freq_steps`` without held-out rows: set to 0, with a warning."""
    if not tcfg.data.eval_every:
        return tcfg
    logging.getLogger(__name__).warning(
        "evaluator.freq_steps=%d: no valid_dataset was given, so nothing is evaluated during training", tcfg.data.eval_every
    )
    return dataclasses.replace(tcfg, data=dataclasses.replace(tcfg.data, eval_every=0))


def to_train_config(
    config: PPOConfig, agent_spec: str | None, n_train: int, n_eval: int, embedded_data: bool, agent_kwargs: dict[str, Any] | None = None
) -> TrainConfig:
    """The controller's ``TrainConfig`` for an AReaL ``config`` (each AReaL key maps to one field)."""
    steps = train_steps(config, n_train)
    return build_dataclass(
        TrainConfig,
        {
            "experiment_name": config.experiment_name,
            "seed": config.seed,
            "model": {"path": config.actor.path},
            "engine": {"kind": config.rollout.backend, "urls": list(config.rollout.server_urls)},
            "gateway": _gateway_section(config),
            "rollout": _rollout_section(config, agent_spec, agent_kwargs),
            "sandbox": dataclasses.asdict(config.sandbox),
            "trainer": _trainer_section(config, steps),
            "recover": {"mode": "off" if config.recover.mode == "disabled" else "auto"},
            "data": {
                "train_size": n_train if embedded_data else 1,
                "eval_size": n_eval if embedded_data else 0,
                "eval_samples": config.eval_samples,
                "eval_every": config.evaluator.freq_steps or 0,
            },
            **_tracking_sections(config),
        },
    )


def _gateway_section(config: PPOConfig) -> dict[str, Any]:
    """``gateway``: gconfig.max_tokens and engine_max_tokens are AReaL's limits of prompt + sampled
    tokens (the run caps the context at the model's positions); its agents ask for
    gconfig.max_tokens, so what fits is what they get (fit_max_tokens)."""
    g, r = config.gconfig, config.rollout
    return {
        "context_length": min(g.max_tokens, r.context_length or g.max_tokens, r.openai.engine_max_tokens or g.max_tokens),
        "default_max_tokens": g.max_new_tokens,
        "max_tokens_cap": max(GatewayConfig.max_tokens_cap, g.max_new_tokens),  # raised when gconfig asks for more
        "fit_max_tokens": True,
        "tool_parser": r.openai.tool_call_parser,
        "reasoning_parser": r.openai.reasoning_parser,
        "admin_key": r.openai.admin_api_key or r.admin_api_key,  # "": drawn at random (printed in online mode)
    }


def _rollout_section(config: PPOConfig, agent_spec: str | None, agent_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """``rollout``: sampling (gconfig), the asynchronous loop (rollout.*) and the agent, when named."""
    g, r = config.gconfig, config.rollout
    rollout = {
        "n_samples": g.n_samples,
        "groups_per_step": config.train_dataset.batch_size,
        "max_head_offpolicyness": r.max_head_offpolicyness,
        "max_concurrent_episodes": r.max_concurrent_rollouts,
        "deadline_s": r.request_timeout,
        "temperature": g.temperature,
        "openai": {"mode": r.openai.mode, "online_gateway": "v2" if r._version == "v2" else "v1"},
        "dynamic_sampling": config.actor.dynamic_sampling,
        "overlong_filter": config.actor.mask_no_eos_with_zero,
    }
    if config.actor.overlong_reward_penalty:
        rollout["overlong_penalty_tokens"] = config.actor.overlong_tokens
        factor = config.actor.overlong_penalty_factor
        rollout["overlong_penalty_factor"] = 1.0 if factor is None else factor
    if agent_spec is not None:
        rollout["agent"] = agent_spec
        rollout["agent_kwargs"] = dict(agent_kwargs or {})
    return rollout


def _trainer_section(config: PPOConfig, steps: int) -> dict[str, Any]:
    """``trainer``: the actor's optimisation settings over ``steps`` steps; recover.freq_steps, when
    set, is the checkpoint interval."""
    actor, opt = config.actor, config.actor.optimizer
    return {
        "steps": steps,
        "lr": opt.lr,
        "lr_scheduler": opt.lr_scheduler_type,
        "warmup_steps": int(opt.warmup_steps_proportion * steps * actor.ppo_n_minibatches),
        "clip_eps": actor.eps_clip,
        "max_grad_norm": opt.gradient_clipping,
        "threads": actor.threads,
        "micro_batch_tokens": actor.mb_spec.max_tokens_per_mb,
        "weight_decay": opt.weight_decay,
        "kl_coef": actor.kl_ctl,
        "minibatches": actor.ppo_n_minibatches,
        "loss": "ppo" if actor.use_decoupled_loss else "grpo",
        "behav_weight_cap": actor.behav_imp_weight_cap,
        "dual_clip": actor.c_clip,
        "clip_eps_high": actor.eps_clip_higher,
        "lora": {
            "rank": actor.lora_rank if actor.use_lora else 0,
            "alpha": actor.lora_alpha,
            "target_modules": list(actor.target_modules) or ["all-linear"],
        },
        "turn_discount": config.rollout.openai.turn_discount,
        **({"checkpoint_every": config.recover.freq_steps} if config.recover.freq_steps else {}),
    }


def _tracking_sections(config: PPOConfig) -> dict[str, Any]:
    """``logger`` and ``tracker`` from stats_logger: metrics.jsonl always, W&B unless disabled,
    TensorBoard when given a path."""
    w, tensorboard = config.stats_logger.wandb, config.stats_logger.tensorboard.path
    return {
        "logger": ["jsonl"] + (["wandb"] if w.mode != "disabled" else []) + (["tensorboard"] if tensorboard else []),
        "tracker": {
            "wandb": {
                "mode": "offline" if w.mode == "disabled" else w.mode,
                "entity": w.entity or "",
                "project": w.project or "",
                "name": w.name or "",
                "group": w.group or "",
                "job_type": w.job_type or "",
                "notes": w.notes or "",
                "tags": list(w.tags or []),
            },
            "tensorboard": {"path": tensorboard or ""},
        },
    }


def with_workflow_temperatures(
    tcfg: TrainConfig, workflow_kwargs: dict[str, Any] | None, eval_workflow_kwargs: dict[str, Any] | None
) -> TrainConfig:
    """The agents' sampling temperature from ``workflow_kwargs`` (the trainer scores tokens at the
    temperature they were sampled with), and the held-out evaluation's from ``eval_workflow_kwargs``
    (AReaL's scripts evaluate at 0.6); the eval workflow itself is not run, the controller's
    evaluation is (see the module docstring)."""
    train_t = (workflow_kwargs or {}).get("temperature")
    eval_t = (eval_workflow_kwargs or {}).get("temperature")
    if train_t is not None:
        tcfg = dataclasses.replace(tcfg, rollout=dataclasses.replace(tcfg.rollout, temperature=float(train_t)))
    if eval_t is not None:
        tcfg = dataclasses.replace(tcfg, data=dataclasses.replace(tcfg.data, eval_temperature=float(eval_t)))
    return tcfg


class PPOTrainer:
    """Context manager; ``train(workflow, eval_workflow)`` runs one training run to its end."""

    def __init__(
        self, config: PPOConfig, train_dataset: list[dict[str, Any]] | None = None, valid_dataset: list[dict[str, Any]] | None = None
    ) -> None:
        if not isinstance(config, PPOConfig):
            raise TypeError(f"config must be a PPOConfig/GRPOConfig (from load_expr_config), got {type(config).__name__}")
        self.config = config
        self.train_dataset = train_dataset
        self.valid_dataset = valid_dataset
        self.run_dir = Path(config.cluster.fileroot) / config.experiment_name / config.trial_name
        self.summary: dict[str, Any] | None = None
        self._tokenizer: Any | None = None

    @property
    def tokenizer(self) -> Any:
        """The tokenizer of ``config.tokenizer_path`` (AReaL's ``trainer.tokenizer``), loaded on first use."""
        if self._tokenizer is None:
            from areal.utils.hf_utils import load_hf_tokenizer

            self._tokenizer = load_hf_tokenizer(self.config.tokenizer_path)
        return self._tokenizer

    def __enter__(self) -> PPOTrainer:
        return self

    def __exit__(self, *exc: Any) -> None:
        # Every process of a run (engine, trainer, zygote) is started and stopped inside train().
        return None

    def train(
        self,
        workflow: Any = None,
        eval_workflow: Any = None,
        workflow_kwargs: dict[str, Any] | None = None,
        eval_workflow_kwargs: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """Train with ``workflow`` until ``total_train_steps``; returns the run's summary. Online
        (``rollout.agent.mode: online``) there is none: ``train()``, as AReaL's online examples call it."""
        from areal.controller.loop import train as controller_train  # deferred: the controller pulls in zmq, torch-free but heavy

        if self.config.rollout.openai.mode == "online":  # the agents run outside the run (areal/controller/online.py)
            if workflow is not None:
                raise ValueError("rollout.agent.mode=online trains on external agents' sessions: call train(workflow=None)")
            plan = WorkflowPlan(None, None, "spec")
        elif workflow is None:
            raise ValueError("train() needs a workflow (an agent or a RolloutWorkflow), unless rollout.agent.mode is online")
        else:
            plan = plan_workflow(workflow, workflow_kwargs, self.config.rollout)
        embedded = self.train_dataset is None or isinstance(self.train_dataset, EmbeddedDataset)
        if not embedded and isinstance(self.valid_dataset, EmbeddedDataset):
            raise ValueError("a custom train_dataset with the embedded valid_dataset is not supported; give both as files")
        n_train = len(self.train_dataset) if self.train_dataset is not None else DataConfig.train_size
        n_eval = len(self.valid_dataset) if isinstance(self.valid_dataset, EmbeddedDataset) else 0
        tcfg = to_train_config(self.config, plan.spec, n_train, n_eval, embedded, plan.kwargs)
        if not embedded and not self.valid_dataset:
            tcfg = without_evaluation(tcfg)
        tcfg = with_workflow_temperatures(tcfg, workflow_kwargs, eval_workflow_kwargs)
        extra: dict[str, Any] = {}
        if plan.obj is not None:
            extra["agent"] = plan.obj
        if not embedded:
            extra["dataset"] = list(self.train_dataset or [])
            if self.valid_dataset:
                extra["eval_dataset"] = list(self.valid_dataset)
        if embedded and isinstance(self.train_dataset, EmbeddedDataset) and self.train_dataset.seed != self.config.seed:
            logging.getLogger(__name__).warning(
                "train_dataset was made with seed %d; the run uses seed %d", self.train_dataset.seed, self.config.seed
            )
        logging.getLogger("httpx").setLevel(logging.WARNING)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        (self.run_dir / "areal_config.json").write_text(json.dumps(dataclasses.asdict(self.config), indent=2))
        (self.run_dir / "config.json").write_text(json.dumps(to_dict(tcfg), indent=2))
        self.summary = run_loop(controller_train(tcfg, self.run_dir, **extra))
        return self.summary
