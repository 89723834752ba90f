"""One optimizer step of PPO/GRPO over complete groups, the same on every rank.

    ring records ─► GroupCollector (complete groups, in completion order; partial ones held)
                 ─► compute_advantages (group-normalised; trainer.credit: per-call credit, credit.py)
                 ─► pack_rows ─► micro-batches ─► the loss chosen once (make_policy_loss) ─► AdamW

Invariants: a step's logprob agreement (``logprob_max_diff``) and proximal logprobs are measured
before any update of the step; each optimizer update is the mean over all trained tokens of all
ranks (local sums divided by the global token count, DDP's mean undone), so N ranks produce the
gradients of one rank on the same data; under FSDP2 every rank runs the same number of forwards
and backwards (short ranks padded with zero-weight micro-batches).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable
from contextlib import nullcontext

import numpy as np
import torch
import torch.distributed as dist

from areal.protocol import Trajectory, decode_trajectory
from areal.ring import RecordSource
from areal.trainer.checkpoint import DataPosition
from areal.trainer.config import CREDITS, LOSSES, TrainerConfig
from areal.trainer.credit import branched_turn_advantages, chain_parents, tree_depths, tree_returns, turn_advantages
from areal.trainer.fsdp import clip_grad_norm, is_sharded, set_gradient_sync
from areal.trainer.loss import (
    aggregation_scale,
    decoupled_ppo_loss,
    episode_advantages,
    grpo_loss,
    kl_estimate,
    rollout_correction,
    sequence_ratio_logprobs,
)
from areal.trainer.packing import MicroBatch, pack_rows

WRITER_CHECK_S = 1.0  # a rank waiting for a record checks this often that the ring's writer still runs


class WriterGone(RuntimeError):
    """The ring's writer (the controller, or a trainer node's receiver) is gone: no record will come."""


class GroupCollector:
    """Reads records from a ring and hands out complete groups, holding partial ones for later.

    ``last_seq`` is the ring sequence number of the last record read; records with
    ``seq <= skip_through`` (already in a checkpoint, re-delivered by the ring) are dropped.

    A wait for a record lasts as long as the ring's writer runs (``WriterGone`` within
    ``WRITER_CHECK_S`` once it is gone): the controller decides when a run has stalled, and its
    work before the first records (the evaluation before training) takes what it takes. Once
    records have arrived, ``record_timeout_s`` (None: no bound) also bounds each wait.
    """

    def __init__(self, reader: RecordSource, record_timeout_s: float | None, skip_through: int = -1) -> None:
        self.reader = reader
        self.record_timeout_s = record_timeout_s
        self.receiving = False  # a record arrived: from now on record_timeout_s bounds each wait
        self.consumed = 0
        self.last_seq = skip_through
        self.skip_through = skip_through
        self.pending: dict[str, list[Trajectory]] = {}  # insertion order = first-seen order
        self.complete: list[str] = []  # group ids in completion order
        self._raw: dict[str, list[bytes]] = {}  # encoded records of pending groups, for checkpoints

    def next_batch(self, groups: int) -> list[Trajectory]:
        """Block until ``groups`` groups are complete; return their trajectories, group by group."""
        while len(self.complete) < groups:
            buf = self._next_record()
            seq = self.reader.last_seq
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

    def _next_record(self) -> bytes:
        """The next record: waited for in slices while the ring's writer runs (see the class)."""
        bound = self.record_timeout_s if self.receiving else None
        deadline = None if bound is None else time.monotonic() + bound
        while True:
            wait_s = WRITER_CHECK_S if deadline is None else max(0.0, min(WRITER_CHECK_S, deadline - time.monotonic()))
            buf = self.reader.get(timeout_s=wait_s)
            if buf is None and not self.reader.writer_alive():
                buf = self.reader.get(timeout_s=0)  # published just before the writer went
                if buf is None:
                    raise WriterGone(
                        f"the ring's writer is gone (the controller, or this node's receiver, exited): no trajectory will come "
                        f"({self.consumed} consumed, {len(self.pending)} groups pending)"
                    )
            if buf is not None:
                self.receiving = True
                return buf
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"no trajectory arrived in {bound}s (trainer.record_timeout_s) while the ring's writer ran "
                    f"({self.consumed} consumed, {len(self.pending)} groups pending)"
                )

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


def compute_advantages(trajs: list[Trajectory], turn_discount: float, eps: float, credit: str = "turn") -> list[torch.Tensor]:
    """One (rows,) advantage tensor per trajectory, normalised per group; ``credit`` picks the
    estimator (areal/trainer/credit.py, which says why).

    Rows that all carry the episode's reward (a float reward), or no reward at all, share the
    episode reward as their return. Rows that carry their own rewards (a {completion_id: reward}
    dict): under ``turn``, discounted returns over the conversation tree (``row_parents``; a
    record without it is read as a chain in call order); under ``episode``, the episode reward
    (their sum). A branched episode (``row_forks``: one tree, its branches under the fork rows,
    docs/branching.md) always takes its tree's returns under ``turn``, and its rows under a fork
    their sibling branches' baseline (``branched_turn_advantages``); under ``episode``, its reward
    (the mean of its branches'). Returns are float64 (a float32 group variance overflows on large rewards); a
    non-finite reward is a ``ValueError`` naming its episode: the controller fails such
    episodes, so one reaching the trainer is a bug of whatever wrote the ring.
    """
    if credit not in CREDITS:
        raise ValueError(f"trainer.credit must be one of {CREDITS}, got {credit!r}")
    returns, depths, parents_of, forks_of = [], [], [], []
    for t in trajs:
        rr32 = t.array("row_rewards")  # (K,) float32 on the wire
        if not (np.isfinite(t.reward) and np.isfinite(rr32).all()):
            raise ValueError(
                f"episode {t.episode_id} (group {t.group_id}) reached the trainer with a non-finite reward: "
                f"episode reward {t.reward!r}, row rewards {rr32.tolist()[:8]}"
            )
        k = max(rr32.size, 1)
        parents = t.array("row_parents").tolist() if len(t.row_parents) else chain_parents(k)
        depths.append(tree_depths(parents))
        forks = t.array("row_forks").tolist()
        parents_of.append(parents)
        forks_of.append(forks)
        shared = rr32.size == 0 or bool((rr32 == np.float32(t.reward)).all()) or not bool(rr32.any())
        if (shared and not forks) or credit == "episode":
            returns.append(np.full(k, float(t.reward)))
        else:
            returns.append(tree_returns(rr32, parents, turn_discount))
    group_ids = [t.group_id for t in trajs]
    if credit == "turn" and any(forks_of):
        adv = branched_turn_advantages(returns, depths, parents_of, forks_of, group_ids, eps)
    elif credit == "turn":
        adv = turn_advantages(returns, depths, group_ids, eps)
    else:
        adv = episode_advantages([torch.from_numpy(r) for r in returns], group_ids, eps)
    return [a[: t.array("row_lens").shape[0]] for a, t in zip(adv, trajs)]


PolicyLoss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], tuple[torch.Tensor, dict[str, float]]]


def make_policy_loss(config: TrainerConfig) -> PolicyLoss:
    """The one policy loss of this run: ``loss(logprobs, proximal, behaviour, advantages, row_index)``.
    With a rollout correction either loss is decoupled: clipped against the proximal (the step's
    starting weights), each token weighted by ``rollout_correction``'s weight."""
    if config.loss not in LOSSES:
        raise ValueError(f"trainer.loss must be one of {LOSSES}, got {config.loss!r}")
    sequence = config.ratio_level == "sequence"
    if config.loss == "grpo" and config.rollout_correction == "none":

        def loss_fn(lp: torch.Tensor, prox: torch.Tensor, beh: torch.Tensor, adv: torch.Tensor, rows: torch.Tensor) -> tuple:
            if sequence:
                lp = sequence_ratio_logprobs(lp, beh, rows)
            return grpo_loss(
                lp, beh, adv, torch.ones_like(lp), config.clip_eps, dual_clip=config.dual_clip, clip_eps_high=config.clip_eps_high
            )
    else:

        def loss_fn(lp: torch.Tensor, prox: torch.Tensor, beh: torch.Tensor, adv: torch.Tensor, rows: torch.Tensor) -> tuple:
            if sequence:
                lp = sequence_ratio_logprobs(lp, prox, rows)
            correction = None
            if config.rollout_correction != "none":
                cap, floor = config.rollout_correction_cap, config.rollout_correction_floor
                correction = rollout_correction(prox, beh, rows, config.rollout_correction, cap, floor)
            return decoupled_ppo_loss(
                lp,
                prox,
                beh,
                adv,
                torch.ones_like(lp),
                config.clip_eps,
                dual_clip=config.dual_clip,
                behav_weight_cap=config.behav_weight_cap,
                clip_eps_high=config.clip_eps_high,
                correction=correction,
            )

    return loss_fn


def all_reduce(values: list[float], op: dist.ReduceOp) -> list[float]:
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=op)
    return t.tolist()


def _empty_micro_batch() -> MicroBatch:
    """One scored token with no weight: lets a rank without trained tokens join DDP's all-reduce."""
    z = torch.zeros(1, dtype=torch.long)
    return MicroBatch(
        input_ids=torch.zeros(1, 2, dtype=torch.long),
        position_ids=torch.arange(2)[None],
        pred_pos=z,
        targets=z,
        behaviour=torch.zeros(1),
        advantages=torch.zeros(1),
        versions=z,
        row_index=z,
        rows=0,
    )


def _to_device(mb: MicroBatch, device: torch.device) -> MicroBatch:
    """The micro-batch with every tensor on ``device`` (the GPU the policy lives on)."""
    if device.type == "cpu":
        return mb
    return dataclasses.replace(
        mb, **{f.name: getattr(mb, f.name).to(device) for f in dataclasses.fields(mb) if isinstance(getattr(mb, f.name), torch.Tensor)}
    )


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


# rollout_correction's statistics averaged over tokens (its largest |log-ratio| is a maximum)
RC_MEANS = ("rc_log_ratio_mean", "rc_kl", "rc_weight_mean", "rc_affected_frac")


@dataclasses.dataclass
class _Tally:
    """This rank's token-weighted loss statistics over a step's micro-batches (all-reduced at the end)."""

    sums: dict[str, float] = dataclasses.field(
        default_factory=lambda: dict.fromkeys(("loss", "clip", "ratio", "kl", "ref_kl", "bw", *RC_MEANS), 0.0)
    )
    ratio_max: float = 0.0
    bw_max: float = 0.0
    rc_absmax: float = 0.0
    grad_norms: list[float] = dataclasses.field(default_factory=list)

    def add(self, loss: torch.Tensor, st: dict[str, float], rows: int) -> None:
        """One micro-batch's loss and statistics; FSDP2's padding (no rows) weighs nothing."""
        w = st["tokens"] if rows else 0.0
        self.sums["loss"] += float(loss.detach()) * w
        self.sums["clip"] += st["clip_frac"] * w
        self.sums["ratio"] += st["ratio_mean"] * w
        self.sums["kl"] += st["approx_kl"] * w
        self.sums["bw"] += st.get("behav_weight_mean", 1.0) * w
        for key in RC_MEANS:
            self.sums[key] += st.get(key, 0.0) * w
        if rows:
            self.ratio_max = max(self.ratio_max, st["ratio_max"])
            self.bw_max = max(self.bw_max, st.get("behav_weight_max", 1.0))
            self.rc_absmax = max(self.rc_absmax, st.get("rc_log_ratio_absmax", 0.0))


def _numerics_accumulator() -> dict[str, float]:
    return {"diff_cur": 0.0, "diff_all": 0.0, "stale_max": 0.0, "n_cur": 0.0, "stale_sum": 0.0, "ent_sum": 0.0}


def _plan_updates(
    scorer: torch.nn.Module, trajs: list[Trajectory], adv: list[torch.Tensor], config: TrainerConfig, device: torch.device
) -> tuple[list[list[MicroBatch]], list[list[MicroBatch]]]:
    """Per optimizer update: its packed micro-batches, and the micro-batches it runs.

    DDP: at least one per rank (its all-reduce is in the last backward). FSDP2: every forward and
    backward is a collective, so every rank runs the largest count of any rank, padded with
    zero-weight micro-batches.
    """
    adv_of = {t.episode_id: a for t, a in zip(trajs, adv)}
    minis = [
        [_to_device(mb, device) for mb in pack_rows(part, [adv_of[t.episode_id] for t in part], config.micro_batch_tokens)]
        for part in _split_groups(trajs, config.minibatches)
    ]
    if is_sharded(scorer):
        counts = [int(c) for c in all_reduce([float(len(m)) for m in minis], dist.ReduceOp.MAX)]
    else:
        counts = [max(len(m), 1) for m in minis]
    if config.loss_agg != "token_mean":  # over each update's tokens and rows on every rank
        for mini in minis:
            tokens, rows = all_reduce([float(sum(len(mb.targets) for mb in mini)), float(sum(mb.rows for mb in mini))], dist.ReduceOp.SUM)
            for mb in mini:
                mb.advantages = mb.advantages * aggregation_scale(mb.row_index, config.loss_agg, tokens, rows, config.loss_agg_norm_tokens)
    works = [mini + [_to_device(_empty_micro_batch(), device) for _ in range(n - len(mini))] for mini, n in zip(minis, counts)]
    return minis, works


def _score_before_updates(
    scorer: torch.nn.Module,
    reference: torch.nn.Module | None,
    batches: list[list[MicroBatch]],
    num: dict[str, float],
    version: int,
    need_prox: bool,
) -> None:
    """One no-grad pass before any update: engine agreement into ``num``, and on each micro-batch
    its proximal (``need_prox``) and reference logprobs."""
    with torch.no_grad():
        for mb in (mb for work in batches for mb in work):
            lp, ent = scorer(mb)
            if not mb.rows:
                continue  # FSDP2 padding: joins the collectives, scores nothing
            _numerics(num, lp, ent, mb, version)
            if need_prox:
                mb.proximal = lp
            if reference is not None:
                mb.reference = reference(mb)[0]


def _backward(
    scorer: torch.nn.Module,
    policy_loss: PolicyLoss,
    mb: MicroBatch,
    world: int,
    total: float,
    config: TrainerConfig,
    reference: torch.nn.Module | None,
    tally: _Tally,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward and backward of one micro-batch; returns its (logprobs, entropies). The loss is
    token-weighted over the global batch (``total`` tokens); x ``world`` undoes DDP's (and
    FSDP2's) mean over ranks."""
    lp, ent = scorer(mb)
    prox = mb.proximal if mb.proximal is not None else lp.detach()
    loss, st = policy_loss(lp, prox, mb.behaviour, mb.advantages, mb.row_index)
    if reference is not None and mb.reference is not None:
        kl = kl_estimate(lp, mb.reference, config.kl_estimator).mean()
        loss = loss + config.kl_coef * kl
        tally.sums["ref_kl"] += float(kl.detach()) * st["tokens"]
    weight = 0.0 if mb.rows == 0 else st["tokens"] * world / total
    (loss * weight).backward()
    tally.add(loss, st, mb.rows)
    return lp, ent


def _global_totals(
    trajs: list[Trajectory], adv: list[torch.Tensor], minis: list[list[MicroBatch]], tally: _Tally, num: dict[str, float]
) -> dict[str, float]:
    """The step's sums and maxima over all ranks, by name."""
    rewards = [t.reward for t in trajs]
    local_sums = {
        **tally.sums,
        "ent_sum": num["ent_sum"],
        "stale_sum": num["stale_sum"],
        "n_cur": num["n_cur"],
        "tokens": float(sum(len(mb.targets) for mini in minis for mb in mini)),
        "n_traj": float(len(trajs)),
        "r_sum": sum(rewards),
        "r_sq": sum(r * r for r in rewards),
        "n_mb": float(sum(len(m) for m in minis)),
        "n_adv": float(sum(bool((a != 0).any()) for a in adv)),
    }
    local_max = {
        "ratio_max": tally.ratio_max,
        "bw_max": tally.bw_max,
        "rc_log_ratio_absmax": tally.rc_absmax,
        "diff_cur": num["diff_cur"],
        "diff_all": num["diff_all"],
        "stale_max": num["stale_max"],
    }
    summed = all_reduce(list(local_sums.values()), dist.ReduceOp.SUM)
    maxed = all_reduce(list(local_max.values()), dist.ReduceOp.MAX)
    return dict(zip(local_sums, summed)) | dict(zip(local_max, maxed))


def _step_metrics(g: dict[str, float], grad_norms: list[float], lr: float, config: TrainerConfig, with_reference: bool) -> dict[str, float]:
    """The step's metrics from its global totals ``g`` (``_global_totals``)."""
    denom = max(g["tokens"], 1.0)
    n_traj = max(g["n_traj"], 1.0)
    r_mean = g["r_sum"] / n_traj
    metrics = {
        "loss": g["loss"] / denom,
        "reward_mean": r_mean,
        "reward_std": max(g["r_sq"] / n_traj - r_mean * r_mean, 0.0) ** 0.5,
        "adv_nonzero_frac": g["n_adv"] / n_traj,
        "clip_frac": g["clip"] / denom,
        "ratio_mean": g["ratio"] / denom,
        "ratio_max": g["ratio_max"],
        "approx_kl": g["kl"] / denom,
        "grad_norm": grad_norms[-1] if grad_norms else 0.0,
        "entropy": g["ent_sum"] / denom,
        "staleness_mean": g["stale_sum"] / denom,
        "staleness_max": g["stale_max"],
        "tokens": g["tokens"],
        "trajectories": g["n_traj"],
        "micro_batches": g["n_mb"],
        "updates": float(len(grad_norms)),
        "lr": lr,
    }
    if config.loss == "ppo" and config.rollout_correction == "none":
        metrics["behav_weight_mean"] = g["bw"] / denom
        metrics["behav_weight_max"] = g["bw_max"]
    if config.rollout_correction != "none":  # the train-inference mismatch, as peers log it
        metrics.update({key: g[key] / denom for key in RC_MEANS})
        metrics["rc_log_ratio_absmax"] = g["rc_log_ratio_absmax"]
    if with_reference:
        metrics["ref_kl"] = g["ref_kl"] / denom
    # Only tokens sampled by the current weights should match exactly; older ones differ by design.
    if g["n_cur"]:
        metrics["logprob_max_diff"] = g["diff_cur"]
    else:
        metrics["logprob_max_diff_stale"] = g["diff_all"]
    return metrics


def train_step(
    scorer: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trajs: list[Trajectory],
    config: TrainerConfig,
    version: int,
    reference: torch.nn.Module | None = None,
    scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
) -> dict[str, float]:
    """One step (``config.minibatches`` optimizer updates) on this rank's complete groups.

    ``scorer`` is a ``PolicyScorer``, possibly wrapped in DDP or sharded by FSDP2; ``reference``
    a frozen ``PolicyScorer`` of the initial weights (only when ``kl_coef`` > 0); ``scheduler``
    the learning-rate schedule, stepped after each optimizer update. Metrics are global over
    ranks: sums and maxima are all-reduced; ``lr`` is the rate of the step's last update.
    """
    policy_loss = make_policy_loss(config)
    world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
    if is_sharded(scorer):
        # A no-grad forward since the last backward (scoring, an evaluation) leaves FSDP2's root
        # unsharded, and parameters() would then list its plain unsharded tensors, which get no
        # gradient: the clipping and the norm would leave out the embeddings and the lm head.
        scorer.reshard()
    params = [p for p in scorer.parameters() if p.requires_grad]
    adv = compute_advantages(trajs, config.turn_discount, config.adv_eps, config.credit)
    minis, works = _plan_updates(scorer, trajs, adv, config, params[0].device)
    # Before any update: engine agreement, proximal (when later updates would otherwise see
    # moved weights) and reference logprobs, in one no-grad pass. With one update and no
    # reference the training forward itself comes before the update, so the numerics are read
    # from it and the extra pass is skipped.
    need_prox = (config.loss == "ppo" or config.rollout_correction != "none") and config.minibatches > 1
    prepass = need_prox or reference is not None or config.minibatches > 1
    num = _numerics_accumulator()
    if prepass:
        _score_before_updates(scorer, reference, works if is_sharded(scorer) else minis, num, version, need_prox)
    tally = _Tally()
    lr = optimizer.param_groups[0]["lr"]  # the rate of the step's last update (or the next one, if none ran)
    for mini, work in zip(minis, works):
        (total,) = all_reduce([float(sum(len(mb.targets) for mb in mini))], dist.ReduceOp.SUM)
        if total == 0:
            continue  # no trained token on any rank: no update
        optimizer.zero_grad(set_to_none=True)
        for i, mb in enumerate(work):
            # Gradients are reduced over ranks on the last backward only; every rank has >= 1 micro-batch.
            with _grad_sync(scorer, i == len(work) - 1):
                lp, ent = _backward(scorer, policy_loss, mb, world, total, config, reference, tally)
            if not prepass and mb.rows:
                _numerics(num, lp.detach(), ent, mb, version)
        tally.grad_norms.append(clip_grad_norm(params, config.max_grad_norm))
        lr = optimizer.param_groups[0]["lr"]
        optimizer.step()
        if scheduler is not None:
            scheduler.step()
    totals = _global_totals(trajs, adv, minis, tally, num)
    return _step_metrics(totals, tally.grad_norms, lr, config, reference is not None)
