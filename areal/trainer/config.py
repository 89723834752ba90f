"""The trainer's configuration, defined once, and the wiring one trainer process is started with.

    conf/*.yaml ─► TrainConfig.trainer : TrainerConfig        (the run's `trainer:` section)
                                    │
    controller ─► TrainerJob(model_path, rings, engine_urls, report_addr, run_dir, ..., trainer, engine_kind)
                  └─ written as run_dir/trainer_config.json ─► python -m areal.trainer --config it

``TrainerConfig`` holds what a user tunes (steps, learning rate, loss, checkpoints, how weights
reach the engines, parallelism); ``TrainerJob`` adds what only the controller knows (where the
model, rings, engines and controller are). Neither imports torch, so the controller and the
config composition stay light. Each validates itself on construction and names the bad field.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field

from areal.dataclass_config import build_dataclass
from areal.engine.config import KINDS as ENGINE_KINDS

LOSSES = ("grpo", "ppo")
CORRECTIONS = ("none", "token_tis", "seq_tis", "token_mis", "seq_mis")  # trainer.rollout_correction: loss.py
RATIO_LEVELS = ("token", "sequence")  # trainer.ratio_level: loss.py:sequence_ratio_logprobs (GSPO)
LOSS_AGGS = ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm")  # trainer.loss_agg: loss.py:aggregation_scale
KL_ESTIMATORS = ("k1", "k3")
WEIGHT_SYNCS = ("disk", "collective")
BACKENDS = ("gloo", "nccl")
PARALLELS = ("ddp", "fsdp2")
LR_SCHEDULERS = ("constant", "linear", "cosine")
CREDITS = ("episode", "turn")  # trainer.credit: areal/trainer/credit.py
ALL_LINEAR = "all-linear"  # peft's shorthand: every linear layer except the output (lm) head
# PolicyScorer applies the lm head from its weight directly and the embeddings are a lookup: an
# adapter there would be trained but never used, so these names are refused as LoRA targets.
LORA_UNTARGETABLE = ("lm_head", "embed_tokens")


def _is_int(value: object) -> bool:
    """An int proper: YAML's and JSON's ``true`` is no count."""
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass
class LoraConfig:
    """``trainer.lora``: low-rank adapters trained instead of the full weights (areal/trainer/lora.py, peft).

    ``rank`` 0 (the default) trains every weight. The engines still receive whole HF weights
    (W + alpha/rank x B @ A, merged at each publish); the adapters are saved beside them in
    peft's layout (``adapter/adapter_config.json`` + ``adapter_model.safetensors``).
    """

    rank: int = 0  # LoRA rank r (0: off, full fine-tuning)
    alpha: float = 16.0  # scaling numerator: the update is alpha / rank x B @ A
    # Module names (suffixes, as peft matches them), e.g. [q_proj, v_proj]; [all-linear]: every
    # linear layer of the decoder (peft's "all-linear", which leaves the lm head out).
    target_modules: list[str] = field(default_factory=lambda: [ALL_LINEAR])
    dropout: float = 0.0  # dropout on the adapters' input, in training forwards only (see lora.py)

    def __post_init__(self) -> None:
        if not _is_int(self.rank) or self.rank < 0:
            raise ValueError(f"trainer.lora.rank must be an integer >= 0 (0: LoRA off), got {self.rank!r}")
        if isinstance(self.alpha, bool) or not isinstance(self.alpha, (int, float)) or not self.alpha > 0:
            raise ValueError(f"trainer.lora.alpha must be a number > 0, got {self.alpha!r}")
        if isinstance(self.dropout, bool) or not isinstance(self.dropout, (int, float)) or not 0 <= self.dropout < 1:
            raise ValueError(f"trainer.lora.dropout must be in [0, 1), got {self.dropout!r}")
        if isinstance(self.target_modules, str):  # peft's own spelling: target_modules="all-linear"
            self.target_modules = [self.target_modules]
        if (
            not isinstance(self.target_modules, list)
            or not self.target_modules
            or not all(isinstance(m, str) and m for m in self.target_modules)
        ):
            raise ValueError(
                f"trainer.lora.target_modules must be a non-empty list of module names or [all-linear], got {self.target_modules!r}"
            )
        if ALL_LINEAR in self.target_modules and len(self.target_modules) > 1:
            raise ValueError(f"trainer.lora.target_modules: {ALL_LINEAR!r} stands alone, got {self.target_modules!r}")
        refused = [m for m in self.target_modules if m.rsplit(".", 1)[-1] in LORA_UNTARGETABLE]
        if refused:
            raise ValueError(
                f"trainer.lora.target_modules: {refused} cannot carry adapters (the trainer applies the lm head "
                "and the embeddings from their weights directly); target the decoder's linear layers"
            )

    @property
    def enabled(self) -> bool:
        return self.rank > 0


@dataclass
class TrainerConfig:
    """The run's ``trainer:`` section: one policy-gradient trainer, on one or several ranks."""

    steps: int = 350  # optimizer steps to run
    lr: float = 3e-5  # AdamW learning rate (the peak, after warm-up)
    # The learning rate over the run's optimizer updates (trainer.steps x trainer.minibatches):
    # "constant", or "linear" / "cosine" decay to 0 by the last update (transformers' get_scheduler).
    lr_scheduler: str = "constant"
    # Optimizer updates of linear warm-up from 0 to lr, before the schedule (transformers' convention:
    # update k of the warm-up runs at lr x k / warmup_steps, so the first at 0).
    warmup_steps: int = 0
    clip_eps: float = 0.2  # ratio clip range [1 - eps, 1 + eps_high]
    clip_eps_high: float | None = None  # DAPO's clip-higher: the upper bound's eps (None: clip_eps)
    max_grad_norm: float = 1.0  # global grad-norm clip
    weight_decay: float = 0.0  # AdamW weight decay
    threads: int = 1  # torch.set_num_threads per rank
    # Tokens packed into one forward pass; a longer row gets a batch of its own. With
    # varlen_attention off, packed attention is one masked SDPA whose cost grows with the square of this.
    micro_batch_tokens: int = 1024
    # Attention of a packed micro-batch row by row (causal SDPA per row, areal/trainer/packing.py)
    # instead of one SDPA masked block-diagonally over all of it; false: transformers' own.
    varlen_attention: bool = True
    loss: str = "grpo"  # "grpo": clip against the behaviour policy; "ppo": decoupled (proximal recomputed)
    minibatches: int = 1  # optimizer updates per step (groups split evenly); > 1 makes ppo recompute proximal logprobs
    dual_clip: float | None = None  # dual-clip bound c > 1 for negative advantages (None: off)
    behav_weight_cap: float | None = None  # ppo: truncate exp(proximal - behaviour) at this (None: no cap)
    # Rollout correction, in either loss (areal/trainer/loss.py:rollout_correction; docs/algorithms.md):
    # importance weights exp(proximal - behaviour) per token or per row, truncated (tis) at
    # rollout_correction_cap or rejecting (mis) what falls outside [floor, cap]. With grpo it makes
    # the loss decoupled: clipped against the step's starting weights, weighted by the correction.
    rollout_correction: str = "none"  # none | token_tis | seq_tis | token_mis | seq_mis
    rollout_correction_cap: float = 2.0
    rollout_correction_floor: float = 0.0  # mis: the lower bound (0: no lower rejection)
    # GSPO (docs/algorithms.md): "sequence" clips one ratio per row, the geometric mean of its tokens' ratios
    ratio_level: str = "token"
    # How token losses add up to the step's loss: "token_mean" (every token weighs the same; DAPO),
    # "seq_mean_token_mean" (each row's mean, then the mean over rows; GRPO's paper), or
    # "seq_mean_token_sum_norm" (each row's sum over loss_agg_norm_tokens, a constant; Dr. GRPO)
    loss_agg: str = "token_mean"
    loss_agg_norm_tokens: int = 0  # seq_mean_token_sum_norm's constant (e.g. the generation's max tokens)
    kl_coef: float = 0.0  # weight of KL(policy || initial weights) in the loss (0: no reference model)
    kl_estimator: str = "k3"  # "k1" or "k3"
    turn_discount: float = 1.0  # gamma of per-turn returns when an episode's rows carry their own rewards
    # How rewards become per-call advantages (areal/trainer/credit.py): "turn": returns over the
    # conversation tree, baseline = other episodes' mean return at the same depth (unbiased when the
    # policy decides when to stop); "episode": every call gets its episode's reward (GRPO). With one
    # call per episode the two are the same.
    credit: str = "turn"
    adv_eps: float = 1e-6  # added to the group std when normalising advantages
    checkpoint_every: int = 10  # steps between atomic checkpoints under run_dir/checkpoints (0: never; a killed run resumes from the last)
    keep_checkpoints: int = 2  # complete checkpoints kept (newest first)
    resume: bool = False  # start from the latest checkpoint in run_dir
    # verl's spelling of recover.mode (auto | disable): when set, it decides recover.mode (areal/controller/recovery.py)
    resume_mode: str = ""
    keep_versions: int = 2  # weight dirs kept under run_dir/weights (newest first)
    # How long a rank waits for its next record once records flow (None: as long as the ring's writer
    # runs). The wait for a rank's first record is never bounded by it: before its first records the
    # controller may evaluate the initial weights for as long as that takes. Either way a rank stops
    # within a second when the ring's writer (the controller, or a trainer node's receiver) is gone.
    record_timeout_s: float | None = None
    # Several ranks: how long one collective of a step (an all-reduce, an FSDP2 gather, DDP's
    # broadcast) may wait for the other ranks; None: torch's default (30 min gloo, 10 min NCCL).
    # Waiting for records or for rank 0's weight push never counts against it: the ranks first
    # meet at a gate that waits while their rings' writer runs (areal/trainer/rank.py, RankGate).
    collective_timeout_s: float | None = None
    engine_timeout_s: float = 300.0  # HTTP timeout of one weight update call
    pause_for_update: bool = True  # pause (abort + client resubmit) generation around each weight update
    head_chunk_elems: int = 1 << 24  # rows x vocab floats per lm-head chunk (memory is flat in the vocabulary)
    weight_sync: str = "disk"  # "disk": save + /update_weights_from_disk; "collective": broadcast (weight_sync.py)
    weight_sync_backend: str = "gloo"  # collective backend: "gloo" (CPU engines) or "nccl" (SGLang on GPUs)
    ranks: int = 1  # trainer processes (torchrun); each reads its own ring
    # GPU ids the ranks run on (their CUDA_VISIBLE_DEVICES; rank i takes the i-th). Empty: what the
    # environment gives. On one node, keep them apart from the servers' (engine.launch.gpus).
    gpus: list[int] = field(default_factory=list)
    parallel: str = "ddp"  # "ddp": weights replicated per rank; "fsdp2": sharded per decoder layer (fsdp.py)
    fsdp_param_dtype: str = "float32"  # fsdp2: dtype of gathered params in forward/backward ("bfloat16" on GPUs)
    lora: LoraConfig = field(default_factory=LoraConfig)  # low-rank adapters instead of full fine-tuning (rank 0: off)

    def __post_init__(self) -> None:
        self._check_schedule()
        self._check_loss()
        self._check_placement()

    def _one_of(self, name: str, choices: tuple[str, ...]) -> None:
        if getattr(self, name) not in choices:
            raise ValueError(f"trainer.{name} must be one of {choices}, got {getattr(self, name)!r}")

    def _check_schedule(self) -> None:
        """Counts, rates and timeouts: how long the run is and how each step goes."""
        for name in (
            "steps",
            "threads",
            "micro_batch_tokens",
            "keep_versions",
            "minibatches",
            "keep_checkpoints",
            "head_chunk_elems",
            "ranks",
        ):
            if not _is_int(getattr(self, name)) or getattr(self, name) < 1:
                raise ValueError(f"trainer.{name} must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("lr", "max_grad_norm", "engine_timeout_s", "adv_eps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"trainer.{name} must be > 0, got {getattr(self, name)!r}")
        if self.record_timeout_s is not None and (isinstance(self.record_timeout_s, bool) or not self.record_timeout_s > 0):
            raise ValueError(
                f"trainer.record_timeout_s must be > 0 seconds, or None (wait while the ring's writer runs), got {self.record_timeout_s!r}"
            )
        t = self.collective_timeout_s
        if t is not None and (isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0):
            raise ValueError(f"trainer.collective_timeout_s must be > 0 seconds, or None (torch's default), got {t!r}")
        if not isinstance(self.varlen_attention, bool):
            raise ValueError(f"trainer.varlen_attention must be true or false, got {self.varlen_attention!r}")
        self._one_of("lr_scheduler", LR_SCHEDULERS)
        updates = self.steps * self.minibatches
        if not _is_int(self.warmup_steps) or not 0 <= self.warmup_steps <= updates:
            raise ValueError(
                f"trainer.warmup_steps must be an integer in [0, trainer.steps x trainer.minibatches = {updates}], got {self.warmup_steps!r}"
            )

    def _check_loss(self) -> None:
        """The loss, its clipping and KL terms, credit assignment and checkpoints."""
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"trainer.clip_eps must be in (0, 1), got {self.clip_eps!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"trainer.weight_decay must be >= 0, got {self.weight_decay!r}")
        self._one_of("loss", LOSSES)
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"trainer.dual_clip must be > 1 or None, got {self.dual_clip!r}")
        if self.behav_weight_cap is not None and not self.behav_weight_cap >= 1:
            raise ValueError(f"trainer.behav_weight_cap must be >= 1 or None, got {self.behav_weight_cap!r}")
        if self.behav_weight_cap is not None and self.loss != "ppo":
            raise ValueError("trainer.behav_weight_cap applies to loss='ppo' only")
        if self.clip_eps_high is not None and not 0 < self.clip_eps_high <= 10:
            raise ValueError(f"trainer.clip_eps_high must be in (0, 10] or None, got {self.clip_eps_high!r}")
        self._one_of("rollout_correction", CORRECTIONS)
        if not self.rollout_correction_cap >= 1:
            raise ValueError(f"trainer.rollout_correction_cap must be >= 1, got {self.rollout_correction_cap!r}")
        if not 0 <= self.rollout_correction_floor < 1:
            raise ValueError(f"trainer.rollout_correction_floor must be in [0, 1), got {self.rollout_correction_floor!r}")
        self._one_of("ratio_level", RATIO_LEVELS)
        self._one_of("loss_agg", LOSS_AGGS)
        if self.loss_agg == "seq_mean_token_sum_norm" and not (_is_int(self.loss_agg_norm_tokens) and self.loss_agg_norm_tokens > 0):
            raise ValueError(
                "trainer.loss_agg=seq_mean_token_sum_norm divides each row's summed loss by a constant: "
                f"set trainer.loss_agg_norm_tokens > 0 (e.g. the generation's max tokens), got {self.loss_agg_norm_tokens!r}"
            )
        if self.rollout_correction != "none" and self.behav_weight_cap is not None:
            raise ValueError("trainer.behav_weight_cap is trainer.rollout_correction=token_tis with its cap: set one of them, not both")
        if not self.kl_coef >= 0:
            raise ValueError(f"trainer.kl_coef must be >= 0, got {self.kl_coef!r}")
        self._one_of("kl_estimator", KL_ESTIMATORS)
        if not 0 <= self.turn_discount <= 1:
            raise ValueError(f"trainer.turn_discount must be in [0, 1], got {self.turn_discount!r}")
        self._one_of("credit", CREDITS)
        if not _is_int(self.checkpoint_every) or self.checkpoint_every < 0:
            raise ValueError(f"trainer.checkpoint_every must be an integer >= 0, got {self.checkpoint_every!r}")

    def _check_placement(self) -> None:
        """Where the ranks run, how they split the model and how weights reach the engines."""
        self._one_of("weight_sync", WEIGHT_SYNCS)
        self._one_of("weight_sync_backend", BACKENDS)
        self._one_of("parallel", PARALLELS)
        if not isinstance(self.gpus, list) or not all(_is_int(g) and g >= 0 for g in self.gpus):
            raise ValueError(f"trainer.gpus must be a list of GPU ids (integers >= 0), got {self.gpus!r}")
        if self.gpus and (len(self.gpus) != self.ranks or len(set(self.gpus)) != len(self.gpus)):
            raise ValueError(
                f"trainer.gpus must list {self.ranks} distinct GPU ids (one per rank, trainer.ranks={self.ranks}), got {self.gpus!r}"
            )
        if self.fsdp_param_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"trainer.fsdp_param_dtype must be 'float32' or 'bfloat16', got {self.fsdp_param_dtype!r}")
        if self.lora.enabled and self.parallel != "ddp":
            raise ValueError(
                f"trainer.lora (rank={self.lora.rank}) is supported with trainer.parallel=ddp only, got parallel={self.parallel!r}: "
                "the adapters are small, so replicating them costs little; set trainer.parallel=ddp"
            )


@dataclass
class TrainerJob:
    """Everything one trainer process needs; the controller writes it as ``run_dir/trainer_config.json``."""

    model_path: str  # initial HF model dir (config, weights, tokenizer files if any)
    ring_name: str  # shared-memory ring the (single) rank reads Trajectory records from
    engine_urls: list[str]  # inference servers to push weights to (SGLang protocol); may be empty
    report_addr: str  # ZeroMQ address the trainer PUSHes TrainerReport/Done/Failed to
    run_dir: str  # weights/, final/, checkpoints/, trainer_metrics.jsonl live here
    groups_per_step: int  # complete groups (prompts) per step, over all ranks
    temperature: float = 1.0  # sampling temperature of the engine; logits are divided by it
    seed: int = 1
    ring_names: list[str] = field(default_factory=list)  # one ring per rank when launched with N > 1 ranks
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    engine_kind: str = "embedded"  # engine.kind: which routes load weights ("vllm": vLLM's, else SGLang's)
    # A whole run resumed (areal/controller/recovery.py): the checkpoint dir whose model, optimizer and schedule
    # this trainer starts from, at any world size (its ring positions are not used: new rings).
    resume_from: str = ""
    # The controller journals every record no checkpoint holds (resume_journal.bin), so records are
    # committed to the ring as they are read; a trainer alone (False) commits after each checkpoint.
    journaled: bool = False

    def __post_init__(self) -> None:
        for name in ("model_path", "ring_name", "run_dir"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"trainer job: {name} must be a non-empty string")
        if not isinstance(self.engine_urls, list) or not all(
            isinstance(u, str) and u.startswith(("http://", "https://")) for u in self.engine_urls
        ):
            raise ValueError(f"trainer job: engine_urls must be a list of http(s) URLs, got {self.engine_urls!r}")
        if "://" not in self.report_addr:
            raise ValueError(f"trainer job: report_addr must be a ZeroMQ address like tcp://..., got {self.report_addr!r}")
        if not _is_int(self.groups_per_step) or self.groups_per_step < 1:
            raise ValueError(f"trainer job: groups_per_step must be an integer >= 1, got {self.groups_per_step!r}")
        if not self.temperature > 0:
            raise ValueError(f"trainer job: temperature must be > 0, got {self.temperature!r}")
        if self.groups_per_step % self.trainer.minibatches:
            raise ValueError(f"trainer.minibatches={self.trainer.minibatches} must divide groups_per_step={self.groups_per_step}")
        if not isinstance(self.ring_names, list) or not all(isinstance(n, str) and n for n in self.ring_names):
            raise ValueError(f"trainer job: ring_names must be a list of non-empty strings, got {self.ring_names!r}")
        if self.engine_kind not in ENGINE_KINDS:
            raise ValueError(f"trainer job: engine_kind must be one of {ENGINE_KINDS}, got {self.engine_kind!r}")
        if self.engine_kind == "vllm" and self.trainer.weight_sync != "disk":
            raise ValueError("trainer job: engine_kind=vllm takes weights from disk only (trainer.weight_sync=disk)")

    def ring_for(self, rank: int, world: int) -> str:
        """The ring rank ``rank`` of ``world`` reads: ``ring_name`` alone, else ``ring_names[rank]``."""
        if world == 1 and not self.ring_names:
            return self.ring_name
        if len(self.ring_names) != world:
            raise ValueError(f"trainer job: ring_names has {len(self.ring_names)} rings for WORLD_SIZE={world}")
        if self.groups_per_step % (world * self.trainer.minibatches):
            raise ValueError(
                f"rollout.groups_per_step={self.groups_per_step} must be divisible by "
                f"WORLD_SIZE x trainer.minibatches = {world * self.trainer.minibatches}"
            )
        return self.ring_names[rank]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> TrainerJob:
        return build_dataclass(cls, json.loads(text), "trainer job: ")
