"""The trainer process: ring -> groups -> packed micro-batches -> PPO/GRPO step -> weights -> engines.

    controller --Trajectory bytes--> shared-memory ring r{rank} --RingReader.get--> GroupCollector
        --complete groups--> advantages --> pack_rows --> train_step (loss chosen once, AdamW)
        --> [checkpoint every k steps] --> run_dir/weights/v{version} (atomic rename)
        --POST /update_weights_from_disk--> engines --> TrainerReport (ZeroMQ PUSH) --> controller

Run as ``python -m areal.trainer --config trainer.json [--resume]`` (a JSON ``TrainerConfig``),
or with ``torchrun --nproc-per-node N -m areal.trainer --config ...`` for N data-parallel ranks.

Invariants:
- Versions: the initial model is version 0; the weights after step ``s`` are version ``s``. A
  ``TrainerReport(step=s, version=s)`` is sent only after every engine answered success for
  version ``s``; a failed update is a ``TrainerFailed`` and a non-zero exit, never a skip.
- A step trains on exactly ``groups_per_step`` complete groups in total: each of the N ranks
  takes ``groups_per_step / N`` complete groups from its own ring, in completion order. Records
  of incomplete groups stay held for later steps; nothing read from a ring is dropped.
- Loss normalisation: each optimizer update is the mean over all trained tokens of all ranks
  (local loss sums are divided by the global token count, and DDP's mean over ranks is undone),
  so N ranks produce the gradients of one rank on the same data.
- The step's logprob agreement (``logprob_max_diff``) and the proximal logprobs are measured
  before any update of the step. Dropout is off (``model.eval()``).
- Several ranks: ``parallel="ddp"``: DDP over gloo on CPU (NCCL on GPUs), every rank holds
  identical weights after every step. ``parallel="fsdp2"`` (areal/fsdp.py): parameters, grads
  and AdamW state sharded per decoder layer; every rank runs the same number of forwards and
  backwards (short ranks are padded with zero-weight micro-batches), and the full weights are
  gathered to rank 0 (a collective) for every publish, checkpoint and the final save. Either
  way rank 0 alone writes checkpoint files, writes weights, pushes them and reports.
- Checkpoints (areal/checkpoint.py) are written before the weights of that step are published,
  so a published version is always recoverable when ``checkpoint_every`` is 1. Resuming skips
  ring records with ``seq <= last_seq`` and restores the held ones: no record is trained twice
  or skipped, provided the ring re-delivers records not yet committed (``RingReader.commit``).
- ``trained_episodes-r{rank}.jsonl`` lists, per step, the episode ids that step trained on; a
  resume truncates it (and ``trainer_metrics.jsonl``) to the checkpoint's step.

Size: ~730 lines, past the 600 mark because config validation, the step (which must agree
across ranks) and the process loop share one boundary; weight publishing (save, push, prune,
Reporter) is the next piece to move out, into a module of its own.

Weights reach the engines from disk (``weight_sync="disk"``) or over a collective
(``"collective"``: areal/weight_sync.py, SGLang's NCCL path; gloo on CPU), rank 0 either way.

Not covered: a learned critic; resuming with another world size or another ``parallel``.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import json
import os
import shutil
import sys
import time
import traceback
import urllib.request
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import torch
import torch.distributed as dist
import zmq

from areal.jsonl import json_line
from areal.checkpoint import DataPosition, latest_checkpoint, load_checkpoint, save_checkpoint
from areal.fsdp import FullWeights, checkpoint_states, clip_grad_norm, is_sharded, set_gradient_sync, shard_policy
from areal.loss import decoupled_ppo_loss, episode_advantages, grpo_loss, kl_estimate, turn_returns
from areal.packing import MicroBatch, PolicyScorer, micro_batch_logits, pack_rows  # noqa: F401 (re-exported)
from areal.protocol import Trajectory, TrainerDone, TrainerFailed, TrainerMessage, TrainerReport, decode_trajectory, encode_trajectory
from areal.weight_sync import BACKENDS, CollectiveWeightPush, WeightUpdateError, free_port, local_address_towards

LOSSES = ("grpo", "ppo")
KL_ESTIMATORS = ("k1", "k3")
WEIGHT_SYNCS = ("disk", "collective")
PARALLELS = ("ddp", "fsdp2")


@dataclass
class TrainerConfig:
    """Everything one trainer process needs; the controller writes it as ``run_dir/trainer_config.json``."""

    model_path: str  # initial HF model dir (config, weights, tokenizer files if any)
    ring_name: str  # shared-memory ring the (single) rank reads Trajectory records from
    engine_urls: list[str]  # inference servers to push weights to (SGLang protocol); may be empty
    report_addr: str  # ZeroMQ address the trainer PUSHes TrainerReport/Done/Failed to
    run_dir: str  # weights/, final/, checkpoints/, trainer_metrics.jsonl live here
    steps: int  # optimizer steps to run
    groups_per_step: int  # complete groups (prompts) per step, over all ranks
    lr: float = 1e-4  # AdamW learning rate; works for the ~2 M-param embedded model
    clip_eps: float = 0.2  # ratio clip range [1 - eps, 1 + eps]
    temperature: float = 1.0  # sampling temperature of the engine; logits are divided by it
    max_grad_norm: float = 1.0  # global grad-norm clip
    weight_decay: float = 0.0  # AdamW weight decay
    seed: int = 1
    threads: int = 1  # torch.set_num_threads
    micro_batch_tokens: int = 8192  # packed tokens per forward; a longer row gets its own batch
    keep_versions: int = 2  # weight dirs kept under run_dir/weights (newest first)
    record_timeout_s: float = 600.0  # fail if the ring yields no record for this long
    engine_timeout_s: float = 300.0  # HTTP timeout of one /update_weights_from_disk call
    pause_for_update: bool = True  # pause (abort + client resubmit) generation around each weight update
    loss: str = "grpo"  # "grpo": clip against the behaviour policy; "ppo": decoupled (proximal + behaviour weight)
    dual_clip: float | None = None  # dual-clip bound c > 1 for negative advantages (None: off)
    behav_weight_cap: float | None = None  # ppo: truncate exp(proximal - behaviour) at this (None: no cap)
    minibatches: int = 1  # optimizer updates per step (groups split evenly); > 1 makes ppo recompute proximal logprobs
    kl_coef: float = 0.0  # weight of KL(policy || initial weights) in the loss (0: no reference model)
    kl_estimator: str = "k3"  # "k1" or "k3"
    turn_discount: float = 1.0  # gamma of per-turn returns when an episode's rows carry their own rewards
    adv_eps: float = 1e-6  # added to the group std when normalising advantages
    checkpoint_every: int = 0  # steps between checkpoints (0: never)
    keep_checkpoints: int = 2  # complete checkpoints kept under run_dir/checkpoints
    resume: bool = False  # start from the latest checkpoint in run_dir (also: --resume)
    ring_names: list[str] = dataclasses.field(default_factory=list)  # one ring per rank when launched with N > 1 ranks
    head_chunk_elems: int = 1 << 24  # rows x vocab floats per lm-head chunk (memory is flat in the vocabulary)
    weight_sync: str = "disk"  # "disk": save + /update_weights_from_disk; "collective": broadcast (areal/weight_sync.py)
    weight_sync_backend: str = "gloo"  # collective backend: "gloo" (CPU engines) or "nccl" (SGLang on GPUs)
    parallel: str = "ddp"  # "ddp": weights replicated per rank; "fsdp2": sharded per decoder layer (areal/fsdp.py)
    fsdp_param_dtype: str = "float32"  # fsdp2: dtype of gathered params in forward/backward ("bfloat16" on GPUs)

    def __post_init__(self) -> None:
        for name in ("model_path", "ring_name", "run_dir"):
            if not isinstance(getattr(self, name), str) or not getattr(self, name):
                raise ValueError(f"trainer.{name} must be a non-empty string")
        if not isinstance(self.engine_urls, list) or not all(
            isinstance(u, str) and u.startswith(("http://", "https://")) for u in self.engine_urls
        ):
            raise ValueError(f"trainer.engine_urls must be a list of http(s) URLs, got {self.engine_urls!r}")
        if "://" not in self.report_addr:
            raise ValueError(f"trainer.report_addr must be a ZeroMQ address like tcp://..., got {self.report_addr!r}")
        for name in ("steps", "groups_per_step", "threads", "micro_batch_tokens", "keep_versions", "minibatches",
                     "keep_checkpoints", "head_chunk_elems"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"trainer.{name} must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("lr", "temperature", "max_grad_norm", "record_timeout_s", "engine_timeout_s", "adv_eps"):
            if not getattr(self, name) > 0:
                raise ValueError(f"trainer.{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"trainer.clip_eps must be in (0, 1), got {self.clip_eps!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"trainer.weight_decay must be >= 0, got {self.weight_decay!r}")
        if self.loss not in LOSSES:
            raise ValueError(f"trainer.loss must be one of {LOSSES}, got {self.loss!r}")
        if self.dual_clip is not None and not self.dual_clip > 1:
            raise ValueError(f"trainer.dual_clip must be > 1 or None, got {self.dual_clip!r}")
        if self.behav_weight_cap is not None and not self.behav_weight_cap >= 1:
            raise ValueError(f"trainer.behav_weight_cap must be >= 1 or None, got {self.behav_weight_cap!r}")
        if self.behav_weight_cap is not None and self.loss != "ppo":
            raise ValueError("trainer.behav_weight_cap applies to loss='ppo' only")
        if not self.kl_coef >= 0:
            raise ValueError(f"trainer.kl_coef must be >= 0, got {self.kl_coef!r}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"trainer.kl_estimator must be one of {KL_ESTIMATORS}, got {self.kl_estimator!r}")
        if not 0 <= self.turn_discount <= 1:
            raise ValueError(f"trainer.turn_discount must be in [0, 1], got {self.turn_discount!r}")
        if not isinstance(self.checkpoint_every, int) or self.checkpoint_every < 0:
            raise ValueError(f"trainer.checkpoint_every must be an integer >= 0, got {self.checkpoint_every!r}")
        if self.groups_per_step % self.minibatches:
            raise ValueError(f"trainer.minibatches={self.minibatches} must divide groups_per_step={self.groups_per_step}")
        if self.weight_sync not in WEIGHT_SYNCS:
            raise ValueError(f"trainer.weight_sync must be one of {WEIGHT_SYNCS}, got {self.weight_sync!r}")
        if self.weight_sync_backend not in BACKENDS:
            raise ValueError(f"trainer.weight_sync_backend must be one of {BACKENDS}, got {self.weight_sync_backend!r}")
        if self.parallel not in PARALLELS:
            raise ValueError(f"trainer.parallel must be one of {PARALLELS}, got {self.parallel!r}")
        if self.fsdp_param_dtype not in ("float32", "bfloat16"):
            raise ValueError(f"trainer.fsdp_param_dtype must be 'float32' or 'bfloat16', got {self.fsdp_param_dtype!r}")
        if not isinstance(self.ring_names, list) or not all(isinstance(n, str) and n for n in self.ring_names):
            raise ValueError(f"trainer.ring_names must be a list of non-empty strings, got {self.ring_names!r}")

    def ring_for(self, rank: int, world: int) -> str:
        """The ring rank ``rank`` of ``world`` reads: ``ring_name`` alone, else ``ring_names[rank]``."""
        if world == 1 and not self.ring_names:
            return self.ring_name
        if len(self.ring_names) != world:
            raise ValueError(f"trainer.ring_names has {len(self.ring_names)} rings for WORLD_SIZE={world}")
        if self.groups_per_step % (world * self.minibatches):
            raise ValueError(f"trainer.groups_per_step={self.groups_per_step} must be divisible by "
                             f"WORLD_SIZE x minibatches = {world * self.minibatches}")
        return self.ring_names[rank]

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> TrainerConfig:
        data = json.loads(text)
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown trainer config fields: {sorted(unknown)}")
        return cls(**data)


class GroupCollector:
    """Reads records from a ring and hands out complete groups, holding partial ones for later.

    ``last_seq`` is the ring sequence number of the last record read; records with
    ``seq <= skip_through`` (already in a checkpoint, re-delivered by the ring) are dropped.
    """

    def __init__(self, reader: object, record_timeout_s: float, skip_through: int = -1) -> None:
        self.reader = reader  # areal.buffer.RingReader (duck-typed: get(timeout_s) -> bytes | None, last_seq)
        self.record_timeout_s = record_timeout_s
        self.consumed = 0
        self.last_seq = skip_through
        self.skip_through = skip_through
        self.pending: dict[str, list[Trajectory]] = {}  # insertion order = first-seen order
        self.complete: list[str] = []  # group ids in completion order
        self._raw: dict[str, list[bytes]] = {}  # encoded records of pending groups, for checkpoints

    def next_batch(self, groups: int) -> list[Trajectory]:
        """Block until ``groups`` groups are complete; return their trajectories, group by group."""
        while len(self.complete) < groups:
            buf = self.reader.get(timeout_s=self.record_timeout_s)
            if buf is None:
                raise TimeoutError(
                    f"no trajectory arrived in {self.record_timeout_s}s "
                    f"({self.consumed} consumed, {len(self.pending)} groups pending)"
                )
            seq = getattr(self.reader, "last_seq", None)
            seq = self.last_seq + 1 if seq is None else seq
            if seq <= self.skip_through:
                continue  # in the checkpoint already: trained, or among the held records
            self.last_seq = seq
            self.consumed += 1
            self._add(buf)
        taken, self.complete = self.complete[:groups], self.complete[groups:]
        for g in taken:
            del self._raw[g]
        return [t for g in taken for t in self.pending.pop(g)]

    def _add(self, buf: bytes) -> None:
        traj = decode_trajectory(buf)
        members = self.pending.setdefault(traj.group_id, [])
        if len(members) >= traj.group_size:
            raise ValueError(f"group {traj.group_id!r} got more than group_size={traj.group_size} records")
        members.append(traj)
        self._raw.setdefault(traj.group_id, []).append(bytes(buf))
        if len(members) == traj.group_size:
            self.complete.append(traj.group_id)

    def position(self) -> DataPosition:
        """What a checkpoint must hold to resume exactly here (held records in arrival order)."""
        return DataPosition(consumed=self.consumed, last_seq=self.last_seq, held=self._held_in_order())

    def _held_in_order(self) -> list[bytes]:
        # Re-adding held records group by group in first-seen order reproduces both ``pending``
        # and ``complete`` (a complete group's last record completed it after earlier groups').
        order = self.complete + [g for g in self.pending if g not in self.complete]
        return [b for g in order for b in self._raw[g]]

    def restore(self, position: DataPosition) -> None:
        """Undo ``position()``: re-hold its records and skip the ring up to its ``last_seq``."""
        for buf in position.held:
            self._add(buf)
        self.consumed, self.last_seq, self.skip_through = position.consumed, position.last_seq, position.last_seq


def compute_advantages(trajs: list[Trajectory], turn_discount: float, eps: float) -> list[torch.Tensor]:
    """One (rows,) advantage tensor per trajectory, normalised per group.

    Rows that all carry the episode's reward (a float reward), or no reward at all, share the
    episode reward as their return; rows that carry their own rewards (a {completion_id: reward}
    dict) get discounted per-turn returns. Returns are float64 (a float32 group variance overflows
    on large rewards); a non-finite reward is a ``ValueError`` naming its episode: the controller
    fails such episodes, so one reaching the trainer is a bug of whatever wrote the ring.
    """
    returns = []
    for t in trajs:
        rr32 = t.array("row_rewards")  # (K,) float32 on the wire
        if not (np.isfinite(t.reward) and np.isfinite(rr32).all()):
            raise ValueError(f"episode {t.episode_id} (group {t.group_id}) reached the trainer with a non-finite reward: "
                             f"episode reward {t.reward!r}, row rewards {rr32.tolist()[:8]}")
        if rr32.size == 0 or bool((rr32 == np.float32(t.reward)).all()) or not bool(rr32.any()):
            returns.append(torch.full((max(rr32.size, 1),), float(t.reward), dtype=torch.float64))
        else:
            returns.append(turn_returns(torch.from_numpy(rr32.astype(np.float64)), turn_discount, dtype=torch.float64))
    adv = episode_advantages(returns, [t.group_id for t in trajs], eps)
    return [a[: t.array("row_lens").shape[0]] for a, t in zip(adv, trajs)]


PolicyLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, float]]]


def make_policy_loss(config: TrainerConfig) -> PolicyLoss:
    """The one policy loss of this run: ``loss(logprobs, proximal, behaviour, advantages)``."""
    if config.loss == "grpo":
        def loss_fn(lp: torch.Tensor, prox: torch.Tensor, beh: torch.Tensor, adv: torch.Tensor) -> tuple:
            return grpo_loss(lp, beh, adv, torch.ones_like(lp), config.clip_eps, dual_clip=config.dual_clip)
    elif config.loss == "ppo":
        def loss_fn(lp: torch.Tensor, prox: torch.Tensor, beh: torch.Tensor, adv: torch.Tensor) -> tuple:
            return decoupled_ppo_loss(lp, prox, beh, adv, torch.ones_like(lp), config.clip_eps,
                                      dual_clip=config.dual_clip, behav_weight_cap=config.behav_weight_cap)
    else:
        raise ValueError(f"trainer.loss must be one of {LOSSES}, got {config.loss!r}")
    return loss_fn


def _all_reduce(values: list[float], op: dist.ReduceOp) -> list[float]:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=op)
    return t.tolist()


def _empty_micro_batch() -> MicroBatch:
    """One scored token with no weight: lets a rank without trained tokens join DDP's all-reduce."""
    z = torch.zeros(1, dtype=torch.long)
    return MicroBatch(input_ids=torch.zeros(1, 2, dtype=torch.long), position_ids=torch.arange(2)[None], pred_pos=z,
                      targets=z, behaviour=torch.zeros(1), advantages=torch.zeros(1), versions=z, rows=0)


def _to_device(mb: MicroBatch, device: torch.device) -> MicroBatch:
    """The micro-batch with every tensor on ``device`` (the GPU the policy lives on)."""
    if device.type == "cpu":
        return mb
    return dataclasses.replace(mb, **{f.name: getattr(mb, f.name).to(device) for f in dataclasses.fields(mb)
                                      if isinstance(getattr(mb, f.name), torch.Tensor)})


def _grad_sync(scorer: torch.nn.Module, sync: bool) -> contextlib.AbstractContextManager:
    """Reduce gradients across ranks on this backward only when ``sync`` (the update's last one)."""
    if is_sharded(scorer):
        set_gradient_sync(scorer, sync)  # FSDP2: a flag, not a context
        return nullcontext()
    return nullcontext() if sync or not hasattr(scorer, "no_sync") else scorer.no_sync()


def _split_groups(trajs: list[Trajectory], parts: int) -> list[list[Trajectory]]:
    """Split complete groups (contiguous in ``trajs``) into ``parts`` equal runs of groups."""
    groups: list[list[Trajectory]] = []
    for t in trajs:
        if not groups or groups[-1][0].group_id != t.group_id:
            groups.append([])
        groups[-1].append(t)
    per = len(groups) // parts
    return [[t for g in groups[i * per : (i + 1) * per] for t in g] for i in range(parts)]


def _numerics(acc: dict[str, float], lp: torch.Tensor, ent: torch.Tensor, mb: MicroBatch, version: int) -> None:
    """Accumulate engine agreement, entropy and staleness of one micro-batch (pre-update logprobs)."""
    diff = (lp - mb.behaviour).abs()
    cur = mb.versions == version
    acc["diff_all"] = max(acc["diff_all"], float(diff.max()))
    if bool(cur.any()):
        acc["diff_cur"] = max(acc["diff_cur"], float(diff[cur].max()))
        acc["n_cur"] += int(cur.sum())
    stale = (version - mb.versions).double()
    acc["stale_sum"] += float(stale.sum())
    acc["stale_max"] = max(acc["stale_max"], float(stale.max()))
    acc["ent_sum"] += float(ent.sum())


def train_step(
    scorer: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trajs: list[Trajectory],
    config: TrainerConfig,
    version: int,
    reference: torch.nn.Module | None = None,
) -> dict[str, float]:
    """One step (``config.minibatches`` optimizer updates) on this rank's complete groups.

    ``scorer`` is a ``PolicyScorer``, possibly wrapped in DDP or sharded by FSDP2; ``reference``
    a frozen ``PolicyScorer`` of the initial weights (only when ``kl_coef`` > 0). Metrics are
    global over ranks: sums and maxima are all-reduced.
    """
    policy_loss = make_policy_loss(config)
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    params = [p for p in scorer.parameters() if p.requires_grad]
    device = params[0].device
    adv = compute_advantages(trajs, config.turn_discount, config.adv_eps)
    adv_of = {t.episode_id: a for t, a in zip(trajs, adv)}
    minis = [[_to_device(mb, device) for mb in pack_rows(part, [adv_of[t.episode_id] for t in part],
                                                         config.micro_batch_tokens)]
             for part in _split_groups(trajs, config.minibatches)]
    # The micro-batches each update runs. DDP: at least one per rank (its all-reduce is in the
    # last backward). FSDP2: every forward and backward is a collective, so every rank runs the
    # largest count of any rank, padded with zero-weight micro-batches.
    if is_sharded(scorer):
        counts = [int(c) for c in _all_reduce([float(len(m)) for m in minis], dist.ReduceOp.MAX)]
    else:
        counts = [max(len(m), 1) for m in minis]
    works = [mini + [_to_device(_empty_micro_batch(), device) for _ in range(n - len(mini))]
             for mini, n in zip(minis, counts)]
    # Before any update: engine agreement, proximal (when later updates would otherwise see
    # moved weights) and reference logprobs, in one no-grad pass.
    need_prox = config.loss == "ppo" and config.minibatches > 1
    # With one update and no reference the training forward itself comes before the update, so
    # the numerics are read from it and the extra no-grad pass is skipped.
    prepass = need_prox or reference is not None or config.minibatches > 1
    num = {"diff_cur": 0.0, "diff_all": 0.0, "stale_max": 0.0, "n_cur": 0.0, "stale_sum": 0.0, "ent_sum": 0.0}
    if prepass:
        with torch.no_grad():
            for mb in (mb for work in (works if is_sharded(scorer) else minis) for mb in work):
                lp, ent = scorer(mb)
                if not mb.rows:
                    continue  # FSDP2 padding: joins the collectives, scores nothing
                _numerics(num, lp, ent, mb, version)
                if need_prox:
                    mb.proximal = lp
                if reference is not None:
                    mb.reference = reference(mb)[0]
    sums = {k: 0.0 for k in ("loss", "clip", "ratio", "kl", "ref_kl", "bw")}
    ratio_max = bw_max = 0.0
    grad_norms = []
    for mini, work in zip(minis, works):
        local = sum(len(mb.targets) for mb in mini)
        (total,) = _all_reduce([float(local)], dist.ReduceOp.SUM)
        if total == 0:
            continue  # no trained token on any rank: no update
        optimizer.zero_grad(set_to_none=True)
        for i, mb in enumerate(work):
            # Gradients are reduced over ranks on the last backward only; every rank has >= 1 micro-batch.
            with _grad_sync(scorer, i == len(work) - 1):
                lp, ent = scorer(mb)
                if not prepass and mb.rows:
                    _numerics(num, lp.detach(), ent, mb, version)
                prox = mb.proximal if mb.proximal is not None else lp.detach()
                loss, st = policy_loss(lp, prox, mb.behaviour, mb.advantages)
                if reference is not None and mb.reference is not None:
                    kl = kl_estimate(lp, mb.reference, config.kl_estimator).mean()
                    loss = loss + config.kl_coef * kl
                    sums["ref_kl"] += float(kl.detach()) * st["tokens"]
                # Token-weighted over the global batch; x world undoes DDP's (and FSDP2's) mean over ranks.
                weight = 0.0 if mb.rows == 0 else st["tokens"] * world / total
                (loss * weight).backward()
            w = st["tokens"] if mb.rows else 0.0
            sums["loss"] += float(loss.detach()) * w
            sums["clip"] += st["clip_frac"] * w
            sums["ratio"] += st["ratio_mean"] * w
            sums["kl"] += st["approx_kl"] * w
            sums["bw"] += st.get("behav_weight_mean", 1.0) * w
            if mb.rows:
                ratio_max = max(ratio_max, st["ratio_max"])
                bw_max = max(bw_max, st.get("behav_weight_max", 1.0))
        grad_norms.append(clip_grad_norm(params, config.max_grad_norm))
        optimizer.step()
    rewards = [t.reward for t in trajs]
    tokens = sum(len(mb.targets) for mini in minis for mb in mini)
    keys = list(sums)
    diff_cur, diff_all, stale_max = num["diff_cur"], num["diff_all"], num["stale_max"]
    summed = _all_reduce([sums[k] for k in keys] + [num["ent_sum"], num["stale_sum"], num["n_cur"], float(tokens), float(len(trajs)),
                          sum(rewards), sum(r * r for r in rewards), float(sum(len(m) for m in minis)),
                          float(sum(bool((a != 0).any()) for a in adv))], dist.ReduceOp.SUM)
    s = dict(zip(keys, summed))
    ent_sum, stale_sum, n_cur, tokens, n_traj, r_sum, r_sq, n_mb, n_adv = summed[len(keys):]
    ratio_max, bw_max, diff_cur, diff_all, stale_max = _all_reduce([ratio_max, bw_max, diff_cur, diff_all, stale_max],
                                                                   dist.ReduceOp.MAX)
    denom = max(tokens, 1.0)
    r_mean = r_sum / max(n_traj, 1.0)
    metrics = {
        "loss": s["loss"] / denom,
        "reward_mean": r_mean,
        "reward_std": max(r_sq / max(n_traj, 1.0) - r_mean * r_mean, 0.0) ** 0.5,
        "adv_nonzero_frac": n_adv / max(n_traj, 1.0),
        "clip_frac": s["clip"] / denom,
        "ratio_mean": s["ratio"] / denom,
        "ratio_max": ratio_max,
        "approx_kl": s["kl"] / denom,
        "grad_norm": grad_norms[-1] if grad_norms else 0.0,
        "entropy": ent_sum / denom,
        "staleness_mean": stale_sum / denom,
        "staleness_max": stale_max,
        "tokens": tokens,
        "trajectories": n_traj,
        "micro_batches": n_mb,
        "updates": float(len(grad_norms)),
    }
    if config.loss == "ppo":
        metrics["behav_weight_mean"] = s["bw"] / denom
        metrics["behav_weight_max"] = bw_max
    if reference is not None:
        metrics["ref_kl"] = s["ref_kl"] / denom
    # Only tokens sampled by the current weights should match exactly; older ones differ by design.
    metrics["logprob_max_diff" if n_cur else "logprob_max_diff_stale"] = diff_cur if n_cur else diff_all
    return metrics


TOKENIZER_FILES = ("tokenizer*", "special_tokens_map.json", "added_tokens.json", "vocab.*", "merges.txt",
                   "chat_template*", "*.tiktoken", "spiece.model")


def copy_tokenizer_files(src: str | Path, dst: str | Path) -> list[str]:
    """Copy whatever tokenizer files ``src`` has into ``dst``; a dir without any is fine."""
    copied = []
    for pattern in TOKENIZER_FILES:
        for path in sorted(Path(src).glob(pattern)):
            if path.is_file():
                shutil.copy2(path, Path(dst) / path.name)
                copied.append(path.name)
    return copied


def save_atomically(model: torch.nn.Module, target: Path, tokenizer_src: str) -> Path:
    """save_pretrained into ``.tmp-<name>`` beside ``target``, then rename it into place."""
    tmp = target.parent / f".tmp-{target.name}"
    for stale in (tmp, target):  # leftovers of a crashed or repeated run
        if stale.exists():
            shutil.rmtree(stale)
    model.save_pretrained(tmp)
    copy_tokenizer_files(tokenizer_src, tmp)
    os.rename(tmp, target)
    return target


def _post_json(url: str, path: str, body: dict, timeout_s: float) -> dict:
    req = urllib.request.Request(url.rstrip("/") + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read() or b"{}")


def push_weights(urls: list[str], model_dir: Path, version: int, timeout_s: float, pause: bool = True) -> None:
    """Load ``model_dir`` as ``version`` on every engine; raise WeightUpdateError unless all succeed.

    With ``pause`` (SGLang's protocol): ``/pause_generation`` in ``abort`` mode first, so the
    update does not wait for running generations. Each comes back to its client with the tokens it
    has; ``EngineClient`` resubmits it (prompt + those tokens) after ``/continue_generation`` and
    stitches the parts, so every token keeps the version that sampled it. (``retract`` would resume
    inside the engine, but SGLang then reports one weight_version for the whole request.)
    Without ``pause``, the engine finishes running requests before loading.
    """
    for url in urls:
        try:
            if pause:
                _post_json(url, "/pause_generation", {"mode": "abort"}, timeout_s)
            try:
                reply = _post_json(url, "/update_weights_from_disk",
                                   {"model_path": str(model_dir), "weight_version": str(version)}, timeout_s)
            finally:
                if pause:
                    _post_json(url, "/continue_generation", {}, timeout_s)
        except OSError as e:  # URLError, HTTPError, refused, timeout: name the engine and version
            raise WeightUpdateError(f"{url}: update to v{version} failed: {e}") from e
        if not reply.get("success"):
            raise WeightUpdateError(f"{url}: update to v{version} not confirmed: {reply}")


def prune_versions(weights_dir: Path, version: int, keep: int) -> None:
    """Delete weight dirs v{k} with k <= version - keep (engines already serve ``version``)."""
    for path in weights_dir.glob("v*"):
        k = path.name[1:]
        if k.isdigit() and int(k) <= version - keep:
            shutil.rmtree(path)


class Reporter:
    """PUSH socket to the controller; close() lingers so the last message is delivered."""

    def __init__(self, addr: str) -> None:
        self.ctx = zmq.Context()
        self.sock = self.ctx.socket(zmq.PUSH)
        self.sock.connect(addr)
        self.encoder = msgspec.msgpack.Encoder()

    def send(self, msg: TrainerMessage) -> None:
        self.sock.send(self.encoder.encode(msg))

    def close(self, linger_s: float = 10.0) -> None:
        self.sock.close(linger=int(linger_s * 1000))
        self.ctx.term()


def open_reader(name: str, timeout_s: float, resume: bool, checkpointed: bool) -> tuple[object, bool]:
    """A RingReader for ``name``; returns (reader, whether this trainer commits records itself).

    With checkpoints, records are committed only after the checkpoint that holds them (trained,
    or held in a pending group) is complete, so a killed trainer gets every later record again:
    exactly once into training. Without checkpoints each record is committed as it is read.
    ``resume=False`` makes the ring refuse a fresh trainer on a ring an earlier one consumed from.
    """
    from areal.buffer import RingReader

    return RingReader(name, timeout_s=timeout_s, resume=resume, auto_commit=not checkpointed), checkpointed


def _truncate_jsonl(path: Path, step: int) -> None:
    """Keep the lines of steps <= ``step`` (a resume redoes the later ones)."""
    if path.exists():
        keep = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in keep))


def _init_distributed(rank: int, world: int, parallel: str = "ddp") -> str:
    """Join the process group torchrun set up; returns the device. gloo on CPU, NCCL on GPUs.

    One DDP rank needs no group; one FSDP2 rank gets a group of its own (on a loopback port when
    not launched by torchrun), so that the sharded path is the same at every world size.
    """
    if world == 1 and parallel == "ddp":
        return "cpu"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    init = None if "MASTER_ADDR" in os.environ else f"tcp://127.0.0.1:{free_port('127.0.0.1')}"
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=init, rank=rank, world_size=world)
    return device


def train(config: TrainerConfig, reporter: Reporter | None, rank: int = 0, world: int = 1) -> Path:
    """Run the steps after the latest checkpoint (or all ``config.steps``); returns the final model dir."""
    from transformers import AutoModelForCausalLM  # imported here: 1 s, unneeded by config users

    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    run_dir = Path(config.run_dir)
    weights_dir, ckpt_root = run_dir / "weights", run_dir / "checkpoints"
    weights_dir.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=torch.float32)
    model.eval()  # no dropout: trainer logprobs must match the engine's
    # NCCL means GPUs (areal/trainer.py _init_distributed); gloo and no group mean the CPU.
    on_gpu = dist.is_initialized() and dist.get_backend() == "nccl"
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    sharded = config.parallel == "fsdp2"
    full = FullWeights(model, rank) if sharded else None  # rank 0's whole copy, taken before sharding
    reference = None
    if config.kl_coef > 0:
        reference = PolicyScorer(copy.deepcopy(model).requires_grad_(False).to(device), config.temperature,
                                 config.head_chunk_elems)
    scorer: torch.nn.Module = PolicyScorer(model.to(device), config.temperature, config.head_chunk_elems)
    if sharded:
        scorer = shard_policy(scorer, device.type, config.fsdp_param_dtype)
    elif world > 1:
        scorer = torch.nn.parallel.DistributedDataParallel(scorer)  # broadcasts rank 0's weights
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    # What checkpoints save and load: the modules themselves, or (FSDP2) their gathered full states.
    ckpt_model, ckpt_optim = checkpoint_states(model, optimizer) if sharded else (model, optimizer)

    def full_model() -> torch.nn.Module | None:
        """The whole model on rank 0 (a collective under FSDP2: every rank calls it), else None."""
        if full is not None:
            return full.gather(model)
        return model if rank == 0 else None
    barrier = dist.barrier if world > 1 else (lambda: None)
    reader, commits = open_reader(config.ring_for(rank, world), config.record_timeout_s, config.resume,
                                  checkpointed=config.checkpoint_every > 0)
    collector = GroupCollector(reader, config.record_timeout_s)
    episodes_log = run_dir / f"trained_episodes-r{rank}.jsonl"
    start = 0
    ckpt = latest_checkpoint(ckpt_root) if config.resume else None
    if ckpt is not None:
        meta, position = load_checkpoint(ckpt, rank, world, ckpt_model, ckpt_optim)
        collector.restore(position)
        start = meta["step"]
    if config.resume:  # steps after the checkpoint (all, without one) are trained again
        for path in (episodes_log, run_dir / "trainer_metrics.jsonl"):
            _truncate_jsonl(path, start)
    local_groups = config.groups_per_step // world
    collective = None
    if rank == 0 and config.weight_sync == "collective" and config.engine_urls:
        address = local_address_towards(config.engine_urls[0])  # where the engines can reach this rank
        # A name of its own per trainer process: a killed trainer cannot close its group, and the
        # engines would refuse a resumed trainer that asked for the same name again.
        collective = CollectiveWeightPush(config.engine_urls, address, free_port(address),
                                          group_name=f"weight_update_group_{os.getpid()}_{time.time_ns()}",
                                          backend=config.weight_sync_backend, timeout_s=config.engine_timeout_s)
        collective.init()
    try:
        for step in range(start + 1, config.steps + 1):
            trajs = collector.next_batch(local_groups)
            t0 = time.perf_counter()
            metrics = train_step(scorer, optimizer, trajs, config, version=step - 1, reference=reference)
            metrics["step_s"] = time.perf_counter() - t0
            with open(episodes_log, "a") as f:
                f.write(json_line({"step": step, "episodes": [t.episode_id for t in trajs]}))
            (consumed, pending) = _all_reduce([float(collector.consumed),
                                               float(sum(len(v) for v in collector.pending.values()))], dist.ReduceOp.SUM)
            if rank == 0:  # logged before the checkpoint: a kill between the two must not lose the line
                metrics["pending_trajectories"] = pending
                with open(run_dir / "trainer_metrics.jsonl", "a") as f:
                    f.write(json_line({"step": step, "version": step, "consumed": int(consumed), **metrics}))
            if config.checkpoint_every and step % config.checkpoint_every == 0:
                if sharded:  # the collective half of the save, on every rank
                    ckpt_model.gather()
                    ckpt_optim.gather()
                save_checkpoint(ckpt_root, step, step, rank, world, ckpt_model, ckpt_optim, collector.position(),
                                barrier, keep=config.keep_checkpoints)
                # After the rename: the checkpoint holds them now. The ring may not have re-delivered
                # all records up to collector.last_seq yet after a resume; those get skipped later.
                seq = min(collector.last_seq, -1 if reader.last_seq is None else reader.last_seq)
                if commits and seq >= 0:
                    reader.commit(seq)
            whole = full_model()
            if rank == 0 and collective is not None:
                collective.push(whole, step, pause=config.pause_for_update)
            elif rank == 0:
                model_dir = save_atomically(whole, weights_dir / f"v{step}", config.model_path)
                push_weights(config.engine_urls, model_dir, step, config.engine_timeout_s, config.pause_for_update)
                prune_versions(weights_dir, step, config.keep_versions)
            if rank == 0:
                if reporter is not None:
                    reporter.send(TrainerReport(step=step, version=step, consumed=int(consumed), metrics=metrics))
    finally:
        reader.close()
    if collective is not None:  # not on a failure: the error that ended training is the one to report
        collective.close()
    final = run_dir / "final"
    whole = full_model()
    if rank == 0:
        save_atomically(whole, final, config.model_path)
        if reporter is not None:
            reporter.send(TrainerDone(steps=config.steps, model_dir=str(final)))
    barrier()
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="PPO/GRPO trainer process (one rank; torchrun for several)")
    parser.add_argument("--config", required=True, help="path to a TrainerConfig JSON file")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in run_dir")
    args = parser.parse_args(argv)
    config = TrainerConfig.from_json(Path(args.config).read_text())
    if args.resume:
        config = dataclasses.replace(config, resume=True)
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    reporter = Reporter(config.report_addr)  # every rank may report its own failure
    try:
        _init_distributed(rank, world, config.parallel)
        train(config, reporter if rank == 0 else None, rank, world)
    except Exception:  # process boundary: tell the controller why, then die non-zero
        error = traceback.format_exc()
        print(error, file=sys.stderr, flush=True)
        reporter.send(TrainerFailed(rank=rank, error=error))
        return 1
    finally:
        reporter.close()
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
