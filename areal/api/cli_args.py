"""AReaL's experiment configuration surface: ``GRPOConfig`` & co. and ``load_expr_config``.

    python3 train.py --config x.yaml key=value ...
        └─ load_expr_config(argv, GRPOConfig) ─► YAML ⊕ overrides (OmegaConf: ${...} resolved; ~key deletes)
               ─► plain dict ─► map_areal_keys ─► typed dataclasses (+ one warning: the keys ignored, and why)

These dataclasses carry the keys of AReaL's guides that this system implements, with AReaL's
names (``gconfig.n_samples``, ``actor.optimizer.lr``, ``train_dataset.batch_size``,
``rollout.openai.mode`` ...). ``areal.experimental.trainer.PPOTrainer`` maps them onto the one
run configuration, ``areal.config.TrainConfig``; there is no second training loop behind them.
AReaL keys with no meaning here (``cluster.n_gpus_per_node``, ``sglang.*``, ``saver.*`` ...) are
named, each with its reason, in one ``AReaLKeysIgnored`` warning (``areal/api/areal_keys.py``),
never dropped silently; a key typed on the command line that neither system knows is an error. Guides extend the configs by subclassing
(``@dataclass class AgentRLConfig(GRPOConfig): ...``), which ``load_expr_config`` supports.

Defaults: a key that becomes one run field defaults to that field's default, read off its
dataclass (``lr: float = TrainerConfig.lr``), so the value is written once; the keys whose
default is this layer's own (``gconfig.n_samples``, ``gconfig.max_tokens``, ``actor.lora_rank``
...) differ from the run's on purpose: ``gconfig.max_tokens`` is AReaL's 32,768, so a config that
does not set it gets the context of its model (the run caps it at ``max_position_embeddings``). The values stay concrete: AReaL's scripts read them
(``config.gconfig.temperature``) and ``areal_config.json`` records them.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from omegaconf import OmegaConf

from areal.api.areal_keys import UNKNOWN_KEY, map_areal_keys
from areal.config import DataConfig, ModelConfig, OpenAIRolloutConfig, RolloutConfig, TrainConfig
from areal.dataclass_config import build_dataclass
from areal.dataset import DatasetConfig  # the loader's own config; here for AReaL's import path
from areal.engine.config import EngineConfig
from areal.gateway import GatewayConfig
from areal.trainer.config import LoraConfig, TrainerConfig
from sandbox.isolation import SandboxConfig

T = TypeVar("T")

AREAL_MAX_TOKENS = 32768  # AReaL's gconfig.max_tokens default (65536 before AReaL's #829)


@dataclass
class GenerationHyperparameters:
    """Sampling settings of rollouts (``gconfig``)."""

    n_samples: int = 4  # trajectories per prompt (one GRPO group)
    max_new_tokens: int = GatewayConfig.default_max_tokens  # tokens one LLM call may sample (gateway.default_max_tokens)
    # prompt + sampled tokens of one call (the context limit); AReaL's default, which the run caps
    # at the model's max_position_embeddings (so a config that does not set it gets the model's context)
    max_tokens: int = AREAL_MAX_TOKENS
    min_new_tokens: int = 0
    greedy: bool = False
    temperature: float = RolloutConfig.temperature  # rollout.temperature
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] | None = None

    def __post_init__(self) -> None:
        for name in ("n_samples", "max_new_tokens", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"gconfig.{name} must be >= 1, got {getattr(self, name)}")
        if self.min_new_tokens < 0 or self.min_new_tokens > self.max_new_tokens:
            raise ValueError(f"gconfig.min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"gconfig.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"gconfig.top_p must be in (0, 1], got {self.top_p}")

    def new(self, **kwargs: Any) -> GenerationHyperparameters:
        """A copy with some fields replaced (validated again)."""
        return dataclasses.replace(self, **kwargs)

    def new_with_stop_and_pad_token_ids(self, tokenizer: Any) -> GenerationHyperparameters:
        """A copy whose ``stop_token_ids`` also hold the tokenizer's EOS and PAD ids."""
        ids = list(self.stop_token_ids)
        for tid in (getattr(tokenizer, "eos_token_id", None), getattr(tokenizer, "pad_token_id", None)):
            if tid is not None and tid not in ids:
                ids.append(int(tid))
        return self.new(stop_token_ids=ids)

    def to_openai_args_dict(self) -> dict[str, Any]:
        """Keyword arguments for ``chat.completions.create`` with these settings."""
        args: dict[str, Any] = {
            "temperature": 0.0 if self.greedy else self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_new_tokens,
        }
        if self.stop:
            args["stop"] = list(self.stop)
        return args


@dataclass
class OptimizerConfig:
    lr: float = TrainerConfig.lr  # trainer.lr
    gradient_clipping: float = TrainerConfig.max_grad_norm  # trainer.max_grad_norm
    weight_decay: float = TrainerConfig.weight_decay  # AdamW weight decay (trainer.weight_decay)
    lr_scheduler_type: str = TrainerConfig.lr_scheduler  # "constant" | "linear" | "cosine" (trainer.lr_scheduler)
    warmup_steps_proportion: float = 0.001  # of the optimizer updates (trainer.warmup_steps, rounded down)

    def __post_init__(self) -> None:
        if not self.lr > 0:
            raise ValueError(f"actor.optimizer.lr must be positive, got {self.lr}")
        if self.lr_scheduler_type not in ("constant", "linear", "cosine"):
            raise ValueError(f"actor.optimizer.lr_scheduler_type must be 'constant', 'linear' or 'cosine', got {self.lr_scheduler_type!r}")
        if not 0 <= self.warmup_steps_proportion <= 1:
            raise ValueError(f"actor.optimizer.warmup_steps_proportion must be in [0, 1], got {self.warmup_steps_proportion}")
        if not self.gradient_clipping > 0:
            raise ValueError(f"actor.optimizer.gradient_clipping must be positive, got {self.gradient_clipping}")


@dataclass
class MicroBatchSpec:
    max_tokens_per_mb: int = TrainerConfig.micro_batch_tokens  # tokens packed into one forward pass (trainer.micro_batch_tokens)

    def __post_init__(self) -> None:
        if self.max_tokens_per_mb < 1:
            raise ValueError(f"actor.mb_spec.max_tokens_per_mb must be >= 1, got {self.max_tokens_per_mb}")


@dataclass
class ActorConfig:
    """The policy being trained."""

    path: str = ModelConfig.path  # "embedded" (built offline on first use) or an HF model directory (model.path)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    eps_clip: float = TrainerConfig.clip_eps  # trainer.clip_eps
    mb_spec: MicroBatchSpec = field(default_factory=MicroBatchSpec)
    threads: int = TrainerConfig.threads  # torch threads of the trainer process (trainer.threads)
    kl_ctl: float = TrainerConfig.kl_coef  # KL(policy || initial weights) coefficient (trainer.kl_coef)
    ppo_n_minibatches: int = TrainerConfig.minibatches  # optimizer updates per step (trainer.minibatches)
    use_decoupled_loss: bool = False  # decoupled PPO with recomputed proximal logprobs (trainer.loss=ppo), else GRPO
    behav_imp_weight_cap: float | None = None  # decoupled PPO: cap of the behaviour importance weight
    c_clip: float | None = None  # dual-clip bound for negative advantages
    eps_clip_higher: float | None = None  # DAPO's clip-higher: the upper clip (trainer.clip_eps_high)
    # DAPO (rollout.*, docs/algorithms.md): AReaL drops groups of equal rewards and trains a smaller
    # batch; here another prompt is started in their place, so a step keeps its groups
    dynamic_sampling: bool = False  # rollout.dynamic_sampling
    overlong_reward_penalty: bool = False  # on: rollout.overlong_penalty_tokens = overlong_tokens
    overlong_tokens: int | None = None  # L_cache of the soft overlong penalty (needed when it is on)
    overlong_penalty_factor: float | None = None  # rollout.overlong_penalty_factor (None: 1.0)
    mask_no_eos_with_zero: bool = False  # a reply cut by its max tokens trains nothing (rollout.overlong_filter)
    use_lora: bool = False  # LoRA adapters instead of full fine-tuning (trainer.lora; the engines get merged weights)
    lora_rank: int = 32  # trainer.lora.rank when use_lora
    lora_alpha: float = LoraConfig.alpha  # trainer.lora.alpha
    target_modules: list[str] = field(default_factory=list)  # trainer.lora.target_modules; empty: every linear layer
    peft_type: str = "lora"  # the only method

    def __post_init__(self) -> None:
        if not self.path:
            raise ValueError("actor.path must be 'embedded' or a model directory")
        if self.peft_type != "lora":
            raise ValueError(f"actor.peft_type must be 'lora' (the only PEFT method here), got {self.peft_type!r}")
        if not self.eps_clip > 0:
            raise ValueError(f"actor.eps_clip must be positive, got {self.eps_clip}")
        if self.overlong_reward_penalty and not (isinstance(self.overlong_tokens, int) and self.overlong_tokens >= 1):
            raise ValueError(
                f"actor.overlong_reward_penalty needs actor.overlong_tokens >= 1 (DAPO's L_cache), got {self.overlong_tokens!r}"
            )


@dataclass
class OpenAIProxyConfig:
    """``rollout.openai``: where agents run and how the gateway parses their model's output."""

    mode: str = OpenAIRolloutConfig.mode  # "subproc": sandboxed agent processes; "inline": the controller's event loop
    tool_call_parser: str | None = GatewayConfig.tool_parser  # gateway.tool_parser
    reasoning_parser: str | None = GatewayConfig.reasoning_parser  # SGLang's names too ("qwen3", "deepseek-r1")
    turn_discount: float = TrainerConfig.turn_discount  # gamma of per-turn returns (trainer.turn_discount)
    export_style: str = "individual"  # one training row per call (the only style agents' episodes export)
    chat_template_type: str = "hf"  # multi-turn prompts always extend the recorded tokens (ArealOpenAI)
    engine_max_tokens: int | None = None  # prompt + sampled tokens of one call (caps the gateway's context)
    subproc_max_workers: int | None = None  # AReaL's pool size; rollout.max_concurrent_rollouts bounds episodes
    session_timeout_seconds: float | None = None  # AReaL's; an episode's limit is rollout.request_timeout
    admin_api_key: str = ""  # online mode: the key that starts sessions (gateway.admin_key); rollout.admin_api_key too

    def __post_init__(self) -> None:
        if self.mode not in ("subproc", "inline", "online"):
            raise ValueError(f"rollout.openai.mode must be 'subproc', 'inline' or 'online', got {self.mode!r}")
        if self.export_style != "individual":
            raise ValueError(f"rollout.openai.export_style must be 'individual' (one row per call), got {self.export_style!r}")
        if self.chat_template_type not in ("hf", "concat"):
            raise ValueError(f"rollout.openai.chat_template_type must be 'hf' or 'concat', got {self.chat_template_type!r}")
        if not 0.0 <= self.turn_discount <= 1.0:
            raise ValueError(f"rollout.openai.turn_discount must be in [0, 1], got {self.turn_discount}")


@dataclass
class InferenceEngineConfig:
    """``rollout``: the inference servers and the asynchronous rollout loop."""

    backend: str = EngineConfig.kind  # "embedded": our CPU engine; "sglang": running servers at server_urls
    server_urls: list[str] = field(default_factory=list)
    max_concurrent_rollouts: int = RolloutConfig.max_concurrent_episodes  # rollout.max_concurrent_episodes
    max_head_offpolicyness: int = RolloutConfig.max_head_offpolicyness
    request_timeout: float = RolloutConfig.deadline_s  # wall-clock limit of one episode, seconds (rollout.deadline_s)
    # prompt + sampled tokens of a call (gateway.context_length, within gconfig.max_tokens); None:
    # gconfig.max_tokens alone. The run caps it at the model's positions
    context_length: int | None = None
    admin_api_key: str = ""  # AReaL's place of the online mode's admin key (rollout.openai.admin_api_key wins)
    openai: OpenAIProxyConfig = field(default_factory=OpenAIProxyConfig)
    # AReaL's generation of the rollout controller; "v2": its online gateway answers a started
    # session 201, as v2's scripts expect (rollout.openai.online_gateway)
    _version: str = ""

    def __post_init__(self) -> None:
        if self.backend not in ("embedded", "sglang"):
            raise ValueError(f"rollout.backend must be 'embedded' or 'sglang', got {self.backend!r}")
        if self.backend == "sglang" and not self.server_urls:
            raise ValueError("rollout.server_urls must list the SGLang servers when rollout.backend=sglang")
        if self.context_length is not None and self.context_length < 1:
            raise ValueError(f"rollout.context_length must be >= 1 (or null), got {self.context_length}")
        for name, key in (("rollout.admin_api_key", self.admin_api_key), ("rollout.agent.admin_api_key", self.openai.admin_api_key)):
            if key and len(key) < 16:  # it starts episodes that train the model: a guessable one is refused
                raise ValueError(f"{name} must be at least 16 characters (or unset: a random one is drawn and printed), got {len(key)}")
        if self.max_concurrent_rollouts < 1 or self.max_head_offpolicyness < 0 or not self.request_timeout > 0:
            raise ValueError(
                "rollout.max_concurrent_rollouts >= 1, rollout.max_head_offpolicyness >= 0 and rollout.request_timeout > 0 are required"
            )


@dataclass
class SchedulerConfig:
    type: str | None = None  # None or "local": every process on this machine

    def __post_init__(self) -> None:
        if self.type not in (None, "local"):
            raise ValueError(f"scheduler.type must be 'local' (or null), got {self.type!r}; no cluster scheduler is built in")


@dataclass
class ClusterConfig:
    fileroot: str = "runs"  # runs go to <fileroot>/<experiment_name>/<trial_name>/

    def __post_init__(self) -> None:
        if not self.fileroot:
            raise ValueError("cluster.fileroot must be a directory")


@dataclass
class WandBConfig:
    """``stats_logger.wandb``: a W&B run unless ``mode`` is disabled (``logger`` and ``tracker.wandb``)."""

    mode: str = "disabled"  # "disabled" | "offline" (files in the run dir, `wandb sync` later) | "online"
    entity: str | None = None
    project: str | None = None  # None: experiment_name
    name: str | None = None  # None: trial_name
    job_type: str | None = None
    group: str | None = None  # None: experiment_name
    notes: str | None = None
    tags: list[str] | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("disabled", "offline", "online"):
            raise ValueError(f"stats_logger.wandb.mode must be 'disabled', 'offline' or 'online', got {self.mode!r}")


@dataclass
class TensorBoardConfig:
    """``stats_logger.tensorboard``: event files written to ``path`` when it is set."""

    path: str | None = None


@dataclass
class StatsLoggerConfig:
    """``stats_logger``: where ``StatsLogger.get_log_path`` points (the run directory by default),
    and the trackers (metrics.jsonl always; W&B and TensorBoard as configured)."""

    experiment_name: str = ""
    trial_name: str = ""
    fileroot: str = ""
    wandb: WandBConfig = field(default_factory=WandBConfig)
    tensorboard: TensorBoardConfig = field(default_factory=TensorBoardConfig)


@dataclass
class EvaluatorConfig:
    """``evaluator``: held-out evaluation every ``freq_steps`` steps during training
    (``data.eval_every``; before and after training it always runs). AReaL's ``freq_epochs`` and
    ``freq_secs`` are listed as ignored."""

    freq_steps: int | None = None


@dataclass
class RecoverConfig:
    """``recover``: AReaL's resume settings. ``mode``: ``disabled`` starts afresh (``recover.mode=off``
    here); ``auto``, ``fault`` and ``resume`` continue a killed run from its last checkpoint
    (``recover.mode=auto``, areal/controller/recovery.py). ``freq_steps``: steps between checkpoints
    (``trainer.checkpoint_every``)."""

    mode: str = "disabled"
    freq_steps: int | None = None

    def __post_init__(self) -> None:
        if self.mode not in ("disabled", "auto", "fault", "resume"):
            raise ValueError(f"recover.mode must be one of disabled, auto, fault, resume, got {self.mode!r}")


@dataclass
class PPOConfig:
    """One experiment: model, data, sampling, rollout and optimisation."""

    experiment_name: str = "areal"
    trial_name: str = "trial0"
    seed: int = TrainConfig.seed
    total_train_epochs: int = 1
    total_train_steps: int | None = None  # overrides epochs when set
    tokenizer_path: str = "embedded"
    eval_samples: int = DataConfig.eval_samples  # sampled answers per held-out problem, plus one greedy (data.eval_samples)
    gconfig: GenerationHyperparameters = field(default_factory=GenerationHyperparameters)
    actor: ActorConfig = field(default_factory=ActorConfig)
    rollout: InferenceEngineConfig = field(default_factory=InferenceEngineConfig)
    train_dataset: DatasetConfig = field(default_factory=DatasetConfig)
    valid_dataset: DatasetConfig | None = None
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    stats_logger: StatsLoggerConfig = field(default_factory=StatsLoggerConfig)
    evaluator: EvaluatorConfig = field(default_factory=EvaluatorConfig)
    recover: RecoverConfig = field(default_factory=RecoverConfig)

    def __post_init__(self) -> None:
        s = self.stats_logger
        s.experiment_name = s.experiment_name or self.experiment_name
        s.trial_name = s.trial_name or self.trial_name
        s.fileroot = s.fileroot or self.cluster.fileroot
        if self.total_train_epochs < 1:
            raise ValueError(f"total_train_epochs must be >= 1, got {self.total_train_epochs}")
        if self.total_train_steps is not None and self.total_train_steps < 1:
            raise ValueError(f"total_train_steps must be >= 1, got {self.total_train_steps}")
        for name in ("experiment_name", "trial_name"):
            value = getattr(self, name)
            if not value or "/" in value or value.startswith("."):
                raise ValueError(f"{name} must be a plain name (no '/'), got {value!r}")


@dataclass
class GRPOConfig(PPOConfig):
    """GRPO is this system's algorithm: group-normalised advantages over ``gconfig.n_samples``."""


@dataclass
class AgentRLConfig(GRPOConfig):
    """The OpenAI Agents guide's config: agents and rewards named by import path."""

    agent_builder_path: str = "areal.workflow.openai_agent.math_agent.build_math_agent"
    agent_builder_kwargs: dict[str, Any] = field(default_factory=dict)
    reward_fn_path: str = "areal.reward.gsm8k.gsm8k_reward_fn"
    agent_type: str = "math"
    n_trajs: int = 1
    max_turns: int = 8
    max_tokens_per_trajectory: int = 8192


# ---- loading ---------------------------------------------------------------------------------


def load_expr_config(argv: list[str], config_cls: type[T]) -> tuple[T, str | None]:
    """``(config, config_file)`` from ``--config FILE`` (optional) and ``key=value`` overrides.

    ``${...}`` interpolations are resolved; values are YAML-typed (``1e-5`` is a float). A key
    that ``config_cls`` does not have raises ``ValueError`` naming its full dotted path.
    """
    config_file, overrides = _split_argv(list(argv))
    # The schema's defaults under the file, so that ${gconfig.max_new_tokens} resolves in a file
    # that does not set it (AReaL resolves against its structured defaults too).
    defaults = OmegaConf.create(dataclasses.asdict(config_cls()))
    base = OmegaConf.merge(defaults, OmegaConf.load(config_file)) if config_file else defaults
    deletions = [o[1:].split("=", 1)[0] for o in overrides if o.startswith("~")]
    for item in overrides:
        if "=" not in item and not item.startswith("~"):
            raise ValueError(f"override {item!r} must be key=value, +key=value or ~key")
    merged = OmegaConf.merge(base, OmegaConf.from_dotlist([o.lstrip("+") for o in overrides if not o.startswith("~")]))
    for key in deletions:  # Hydra's ~key: the key goes, as if the file never had it
        *head, last = key.split(".")
        parent = OmegaConf.select(merged, ".".join(head)) if head else merged
        if parent is None or last not in parent:
            raise ValueError(f"~{key}: there is no key {key} to delete")
        del parent[last]
    data, ignored = map_areal_keys(OmegaConf.to_container(merged, resolve=True) or {}, config_cls)
    typed = [o.lstrip("+").split("=", 1)[0] for o in overrides if not o.startswith("~")]
    unknown = [k for k in typed for i, why in ignored.items() if why == UNKNOWN_KEY and (k == i or k.startswith(i + "."))]
    if unknown:  # a key typed on the command line that neither this system nor AReaL's files know: a typo
        raise ValueError(f"unknown config key(s) {', '.join(unknown)} for {config_cls.__name__}")
    if ignored:
        warnings.warn(AReaLKeysIgnored(ignored), stacklevel=2)
    return build_dataclass(config_cls, data), config_file


class AReaLKeysIgnored(UserWarning):
    """One warning per loaded config: the AReaL keys that have no effect here, each with why.
    Rebuilt from its message (``cls(*warning.args)``, as pytest-xdist carries warnings between
    processes), it is that message again."""

    def __init__(self, ignored: dict[str, str] | str) -> None:
        if isinstance(ignored, str):
            self.ignored: dict[str, str] = {}
            super().__init__(ignored)
            return
        self.ignored = ignored
        by_reason: dict[str, list[str]] = {}
        for key, why in ignored.items():
            by_reason.setdefault(why, []).append(key)
        lines = [f"  {', '.join(keys)}: {why}" for why, keys in by_reason.items()]
        super().__init__(f"{len(ignored)} AReaL config key(s) have no effect in this system:\n" + "\n".join(lines))


def _split_argv(argv: list[str]) -> tuple[str | None, list[str]]:
    config_file = None
    rest = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv):
                raise ValueError("--config needs a file path")
            config_file, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--config="):
            config_file = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            raise ValueError(f"unknown option {arg!r}; use --config FILE and key=value overrides")
        else:
            rest.append(arg)
        i += 1
    if config_file is not None and not Path(config_file).is_file():
        raise FileNotFoundError(f"config file {config_file} does not exist")
    return config_file, rest
