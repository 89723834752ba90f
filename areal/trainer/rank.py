"""One trainer rank's process: ring -> groups -> PPO/GRPO step -> checkpoint -> weights -> engines.

    controller --Trajectory bytes--> shared-memory ring r{rank} --RingReader.get--> GroupCollector
        --complete groups--> advantages --> pack_rows --> train_step (loss chosen once, AdamW, lr schedule)
        --> [checkpoint every k steps] --> run_dir/weights/v{version} (atomic rename)
        --POST /update_weights_from_disk--> engines --> TrainerReport (ZeroMQ PUSH) --> controller

Run as ``python -m areal.trainer --config trainer.json [--resume]`` (a JSON ``TrainerJob``),
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
  identical weights after every step. ``parallel="fsdp2"`` (areal/trainer/fsdp.py): parameters, grads
  and AdamW state sharded per decoder layer; every rank runs the same number of forwards and
  backwards (short ranks are padded with zero-weight micro-batches), and the full weights are
  gathered to rank 0 (a collective) for every publish, checkpoint and the final save. Either
  way rank 0 alone writes checkpoint files, writes weights, pushes them and reports.
- Waits between ranks: a step's collectives start only once every rank holds its batch, and a
  checkpoint's and the final save's barriers once rank 0 is done writing; the ranks meet at a
  ``RankGate`` first, which waits while the rank's ring writer runs, never on a fixed clock. So a
  long evaluation before the first records, a rank whose records come later than the others', or
  rank 0 saving and pushing a large model cannot expire the process group's timeout
  (``trainer.collective_timeout_s``, which bounds the collectives themselves).
- Checkpoints (areal/trainer/checkpoint.py) are written before the weights of that step are published,
  so a published version is always recoverable when ``checkpoint_every`` is 1. Resuming skips
  ring records with ``seq <= last_seq`` and restores the held ones: no record is trained twice
  or skipped, provided the ring re-delivers records not yet committed (``RingReader.commit``).
- ``trained_episodes-r{rank}.jsonl`` lists, per step, the episode ids that step trained on; a
  resume truncates it (and ``trainer_metrics.jsonl``) to the checkpoint's step.

LoRA (``trainer.lora.rank > 0``, areal/trainer/lora.py): the adapters are injected into the HF
model before the scorer wraps it and are all the optimizer holds; what rank 0 publishes is the
merged model (same HF names and shapes) with the adapter beside it in ``adapter/``.

Weights reach the engines from disk (``weight_sync="disk"``) or over a collective
(``"collective"``: areal/weights/collective.py, SGLang's NCCL path; gloo on CPU), rank 0 either way.

Not covered: a learned critic; resuming with another world size or another ``parallel``.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import datetime
import functools
import json
import os
import resource
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed as dist

from areal.engine.launch import free_port
from areal.jsonl import json_line
from areal.protocol import TrainerDone, TrainerFailed, TrainerReport, Trajectory
from areal.ring.buffer import RingReader
from areal.trainer.checkpoint import latest_checkpoint, load_checkpoint, save_checkpoint
from areal.trainer.config import TrainerConfig, TrainerJob
from areal.trainer.fsdp import FullWeights, shard_policy
from areal.trainer.packing import PolicyScorer
from areal.trainer.reports import Reporter
from areal.trainer.step import GroupCollector, WriterGone, all_reduce, train_step
from areal.weights.collective import CollectiveWeightPush, local_address_towards
from areal.weights.disk import prune_versions, push_weights, save_atomically

if TYPE_CHECKING:
    from areal.trainer.lora import MergedWeights


def open_reader(name: str, resume: bool, checkpointed: bool) -> tuple[RingReader, bool]:
    """A RingReader for ``name``; returns (reader, whether this trainer commits records itself).

    The ring exists before the trainer starts (the controller, or a trainer node's host, makes
    it): attaching waits only RingReader's default 30 s, as a missing ring is a misnamed one.

    With checkpoints, records are committed only after the checkpoint that holds them (trained,
    or held in a pending group) is complete, so a killed trainer gets every later record again:
    exactly once into training. Without checkpoints each record is committed as it is read.
    ``resume=False`` makes the ring refuse a fresh trainer on a ring an earlier one consumed from.
    """
    return RingReader(name, resume=resume, auto_commit=not checkpointed), checkpointed


def make_lr_scheduler(optimizer: torch.optim.Optimizer, config: TrainerConfig) -> torch.optim.lr_scheduler.LRScheduler:
    """transformers' schedule for ``trainer.lr_scheduler`` over every optimizer update of the run
    (``steps x minibatches``), after ``warmup_steps`` updates of linear warm-up; stepped once per
    update (``train_step``) and saved in each checkpoint."""
    from transformers import get_scheduler  # imported here: slow to import, unneeded by config users

    if config.lr_scheduler == "constant":
        name = "constant_with_warmup"  # with warmup_steps=0: the constant rate from the first update
    elif config.lr_scheduler == "linear":
        name = "linear"
    elif config.lr_scheduler == "cosine":
        name = "cosine"
    else:
        raise ValueError(f"trainer.lr_scheduler {config.lr_scheduler!r} has no schedule")
    return get_scheduler(name, optimizer, num_warmup_steps=config.warmup_steps, num_training_steps=config.steps * config.minibatches)


def _truncate_jsonl(path: Path, step: int) -> None:
    """Keep the lines of steps <= ``step`` (a resume redoes the later ones); written aside and
    renamed, so that a reader never sees the file empty."""
    if path.exists():
        keep = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text("".join(line + "\n" for line in keep))
        os.replace(tmp, path)


def _init_distributed(rank: int, world: int, parallel: str = "ddp", timeout_s: float | None = None) -> str:
    """Join the process group torchrun set up; returns the device. gloo on CPU, NCCL on GPUs.

    One DDP rank needs no group (but still its GPU, where there is one); one FSDP2 rank gets a
    group of its own (on a loopback port when not launched by torchrun), so that the sharded path
    is the same at every world size. ``timeout_s`` (trainer.collective_timeout_s; None: torch's
    default) bounds each collective.
    """
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
    if world == 1 and parallel == "ddp":
        return device
    init = None if "MASTER_ADDR" in os.environ else f"tcp://127.0.0.1:{free_port('127.0.0.1')}"
    timeout = None if timeout_s is None else datetime.timedelta(seconds=timeout_s)
    dist.init_process_group("nccl" if device == "cuda" else "gloo", init_method=init, rank=rank, world_size=world, timeout=timeout)
    return device


GATE_POLL_S = 0.1  # the longest sleep of a rank at the gate: how soon it sees the others arrive, or its writer gone


class RankGate:
    """Where the ranks wait for one another outside a collective: ``wait()`` returns once every
    rank called it, and lasts as long as that takes while ``alive()`` (the rank's ring writer runs;
    None: nothing to watch), else ``WriterGone``. One rank alone passes at once.

    A collective bounds its wait by the process group's timeout, the right bound for work every
    rank does at once, and the wrong one for a rank waiting on its peers' records (they come
    from the controller, which may be evaluating) or on rank 0 writing and pushing a model. The
    gate is a barrier on a gloo group of its own whose timeout no wait reaches (``GATE_TIMEOUT``),
    polled: a rank whose peer died is ended by torchrun, which stops every rank when one fails."""

    GATE_TIMEOUT = datetime.timedelta(days=365)

    def __init__(self, world: int) -> None:
        self.group = dist.new_group(backend="gloo", timeout=self.GATE_TIMEOUT) if world > 1 else None

    def wait(self, why: str, alive: Callable[[], bool] | None = None) -> None:
        if self.group is None:
            return
        work, sleep_s = dist.barrier(group=self.group, async_op=True), 0.001
        while not work.is_completed():
            if alive is not None and not alive():
                raise WriterGone(f"the ring's writer is gone (the controller, or this node's receiver, exited) while waiting for {why}")
            time.sleep(sleep_s)
            sleep_s = min(GATE_POLL_S, 2 * sleep_s)
        work.wait()  # raises what failed it


@dataclasses.dataclass
class _Policy:
    """The model as one rank trains it, with what trains it."""

    model: torch.nn.Module  # the HF model (LoRA's adapters injected into it in place)
    scorer: torch.nn.Module  # PolicyScorer over it; DDP-wrapped or FSDP2-sharded with several ranks
    reference: torch.nn.Module | None  # the initial weights' scorer (kl_coef > 0 only)
    published: torch.nn.Module | MergedWeights  # what rank 0 saves and pushes (DDP): the model, or LoRA's merge of it
    full: FullWeights | None  # FSDP2: rank 0's whole copy, taken before sharding
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LRScheduler
    shape: dict  # what the checkpointed state's names depend on (LoRA's config)

    def whole(self, rank: int) -> torch.nn.Module | MergedWeights | None:
        """The whole model on rank 0 (a collective under FSDP2: every rank calls it), else None."""
        if self.full is not None:
            return self.full.gather(self.model)
        return self.published if rank == 0 else None


def _build_policy(job: TrainerJob, rank: int, world: int, gate: RankGate) -> _Policy:
    """Load the initial model and set this rank up to train it: reference, LoRA, DDP or FSDP2, AdamW;
    the ranks meet at ``gate`` before DDP's or FSDP2's first collective (one may load slower)."""
    config = job.trainer
    from transformers import AutoModelForCausalLM  # imported here: slow to import, unneeded by config users

    model = AutoModelForCausalLM.from_pretrained(job.model_path, dtype=torch.float32)
    model.eval()  # no dropout: trainer logprobs must match the engine's
    # The GPU _init_distributed chose, where there is one (NCCL then joins the ranks), else the CPU.
    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
    full = FullWeights(model, rank) if config.parallel == "fsdp2" else None
    reference: torch.nn.Module | None = None
    if config.kl_coef > 0 and not config.lora.enabled:  # LoRA's reference is its own frozen base, below
        reference = PolicyScorer(
            copy.deepcopy(model).requires_grad_(False).to(device), job.temperature, config.head_chunk_elems, config.varlen_attention
        )
    published: torch.nn.Module | MergedWeights = model
    if config.lora.enabled:  # peft is the optional `lora` extra: imported only when asked for
        from areal.trainer.lora import AdaptersOff, MergedWeights, attach_adapters

        adapters = attach_adapters(model, config.lora)  # injects the adapters into `model` in place
        published = MergedWeights(adapters)
    scorer: torch.nn.Module = PolicyScorer(model.to(device), job.temperature, config.head_chunk_elems, config.varlen_attention)
    if config.kl_coef > 0 and config.lora.enabled:
        reference = AdaptersOff(scorer, adapters)  # the initial weights without a copy of them
    gate.wait("the other ranks to load the model")
    if full is not None:
        scorer = shard_policy(scorer, device.type, config.fsdp_param_dtype)
    elif world > 1:
        scorer = torch.nn.parallel.DistributedDataParallel(scorer)  # broadcasts rank 0's weights
    trainable = [p for p in model.parameters() if p.requires_grad]  # all of them, or LoRA's adapters
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=config.weight_decay)
    shape = {"lora": dataclasses.asdict(config.lora)} if config.lora.enabled else {}
    return _Policy(model, scorer, reference, published, full, optimizer, make_lr_scheduler(optimizer, config), shape)


def _resume(job: TrainerJob, policy: _Policy, collector: GroupCollector, rank: int, world: int) -> int:
    """Load the checkpoint to continue from; returns its step (0: none). ``job.resume_from`` (a
    whole run resumed) restores the state, not the ring positions (new rings, any world size);
    ``trainer.resume`` this run's latest checkpoint, ring position included. Either way the
    logs of later steps are truncated: those steps are trained again."""
    config, run_dir = job.trainer, Path(job.run_dir)
    state = (policy.model, policy.optimizer, policy.scheduler)
    start = 0
    if job.resume_from:
        meta, _ = load_checkpoint(Path(job.resume_from), rank, world, *state, positions=False, model_shape=policy.shape)
        start = meta["step"]
    ckpt = latest_checkpoint(run_dir / "checkpoints") if config.resume else None
    if ckpt is not None:
        meta, position = load_checkpoint(ckpt, rank, world, *state, model_shape=policy.shape)
        collector.restore(position)
        start = meta["step"]
    if config.resume or job.resume_from:
        # Each rank its own file; the shared trainer_metrics.jsonl rank 0 alone (two ranks
        # rewriting it at once could leave it empty: one truncates while the other reads).
        for path in (run_dir / f"trained_episodes-r{rank}.jsonl", *([run_dir / "trainer_metrics.jsonl"] if rank == 0 else [])):
            _truncate_jsonl(path, start)
    if job.resume_from and start > 0:  # the controller loads the checkpoint's weights into the engines
        whole = policy.whole(rank)  # a collective under FSDP2
        version_dir = run_dir / "weights" / f"v{start}"
        if rank == 0 and not (version_dir / "config.json").is_file():  # the killed run had not published them
            save_atomically(whole, version_dir, job.model_path)
    return start


def _open_collective(job: TrainerJob, rank: int) -> CollectiveWeightPush | None:
    """Rank 0's weight-update group with the engines (``trainer.weight_sync=collective``), else None."""
    config = job.trainer
    if rank != 0 or config.weight_sync != "collective" or not job.engine_urls:
        return None
    address = local_address_towards(job.engine_urls[0])  # where the engines can reach this rank
    # A name of its own per trainer process: a killed trainer cannot close its group, and the
    # engines would refuse a resumed trainer that asked for the same name again.
    collective = CollectiveWeightPush(
        job.engine_urls,
        address,
        free_port(address),
        group_name=f"weight_update_group_{os.getpid()}_{time.time_ns()}",
        backend=config.weight_sync_backend,
        timeout_s=config.engine_timeout_s,
    )
    collective.init()
    return collective


def _log_step(job: TrainerJob, rank: int, step: int, trajs: list[Trajectory], collector: GroupCollector, metrics: dict[str, float]) -> int:
    """Log the step: this rank's episode ids, and (rank 0) its metrics with the records pending
    over all ranks; returns the records consumed over all ranks."""
    run_dir = Path(job.run_dir)
    with open(run_dir / f"trained_episodes-r{rank}.jsonl", "a") as f:
        f.write(json_line({"step": step, "episodes": [t.episode_id for t in trajs]}))
    (consumed, pending) = all_reduce([float(collector.consumed), float(sum(len(v) for v in collector.pending.values()))], dist.ReduceOp.SUM)
    (metrics["peak_rss_mb"],) = all_reduce([metrics["peak_rss_mb"]], dist.ReduceOp.MAX)  # the largest rank's
    if rank == 0:  # logged before the checkpoint: a kill between the two must not lose the line
        metrics["pending_trajectories"] = pending
        with open(run_dir / "trainer_metrics.jsonl", "a") as f:
            f.write(json_line({"step": step, "version": step, "consumed": int(consumed), **metrics}))
    return int(consumed)


def _checkpoint(
    job: TrainerJob,
    policy: _Policy,
    collector: GroupCollector,
    commit_to: RingReader | None,
    step: int,
    rank: int,
    world: int,
    barrier: Callable[[], None],
) -> None:
    """Save the checkpoint of ``step`` (``barrier``: where the ranks wait for one another); then
    commit to ``commit_to`` (the ring, when this trainer commits) the records it holds."""
    config = job.trainer
    save_checkpoint(
        Path(job.run_dir) / "checkpoints",
        step,
        step,
        rank,
        world,
        policy.model,
        policy.optimizer,
        collector.position(),
        barrier,
        keep=config.keep_checkpoints,
        scheduler=policy.scheduler,
        model_shape=policy.shape,
    )
    if commit_to is None:
        return
    # After the rename: the checkpoint holds them now. The ring may not have re-delivered all
    # records up to collector.last_seq yet after a resume; those get skipped later.
    seq = min(collector.last_seq, -1 if commit_to.last_seq is None else commit_to.last_seq)
    if seq >= 0:
        commit_to.commit(seq)


def _publish(
    job: TrainerJob, step: int, whole: torch.nn.Module | MergedWeights, collective: CollectiveWeightPush | None, metrics: dict[str, float]
) -> None:
    """Rank 0: the weights after ``step`` to the engines, over ``collective`` or through disk
    (``run_dir/weights/v{step}``, older versions pruned)."""
    config = job.trainer
    if collective is not None:
        collective.push(whole, step, pause=config.pause_for_update)
        return
    weights_dir = Path(job.run_dir) / "weights"
    model_dir = save_atomically(whole, weights_dir / f"v{step}", job.model_path)
    skipped = push_weights(job.engine_urls, model_dir, step, config.engine_timeout_s, config.pause_for_update, kind=job.engine_kind)
    metrics["engines_updated"] = len(job.engine_urls) - len(skipped)
    prune_versions(weights_dir, step, config.keep_versions)


def _save_final(job: TrainerJob, policy: _Policy, reporter: Reporter | None, rank: int, gate: RankGate) -> Path:
    """Rank 0 saves ``run_dir/final`` and reports it done; every rank waits for that at ``gate``."""
    final = Path(job.run_dir) / "final"
    whole = policy.whole(rank)  # a collective under FSDP2
    if rank == 0:
        save_atomically(whole, final, job.model_path)
        if reporter is not None:
            reporter.send(TrainerDone(steps=job.trainer.steps, model_dir=str(final)))
    gate.wait("rank 0 to save the final model")
    return final


def train(job: TrainerJob, reporter: Reporter | None, rank: int = 0, world: int = 1) -> Path:
    """Run the steps after the latest checkpoint (or all ``steps``); returns the final model dir."""
    config = job.trainer
    torch.set_num_threads(config.threads)
    torch.manual_seed(job.seed)
    (Path(job.run_dir) / "weights").mkdir(parents=True, exist_ok=True)
    gate = RankGate(world)  # first, while the ranks are together: they just met in init_process_group
    policy = _build_policy(job, rank, world, gate)
    # A run's controller journals every record no checkpoint holds (areal/controller/recovery.py), so its
    # trainer commits records as it reads them; a trainer alone commits them after a checkpoint.
    reader, commits = open_reader(job.ring_for(rank, world), config.resume, checkpointed=config.checkpoint_every > 0 and not job.journaled)
    collector = GroupCollector(reader, config.record_timeout_s)
    start = _resume(job, policy, collector, rank, world)
    collective = _open_collective(job, rank)
    try:
        for step in range(start + 1, config.steps + 1):
            trajs = collector.next_batch(job.groups_per_step // world)
            # the step's collectives start once every rank holds its batch (and rank 0 published the last step)
            gate.wait(f"the other ranks' records of step {step}", reader.writer_alive)
            t0, started = time.perf_counter(), time.time()
            metrics = train_step(
                policy.scorer, policy.optimizer, trajs, config, version=step - 1, reference=policy.reference, scheduler=policy.scheduler
            )
            metrics["step_s"] = time.perf_counter() - t0
            metrics["step_started"] = started  # wall clock, to line the step up with the engine's spans (engine.busy_log)
            metrics["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # this rank's, so far (KiB on Linux)
            consumed = _log_step(job, rank, step, trajs, collector, metrics)
            if config.checkpoint_every and step % config.checkpoint_every == 0:
                barrier = functools.partial(gate.wait, f"the checkpoint of step {step}", reader.writer_alive)
                _checkpoint(job, policy, collector, reader if commits else None, step, rank, world, barrier)
            whole = policy.whole(rank)  # a collective under FSDP2
            if rank == 0:
                t_publish = time.time()
                _publish(job, step, whole, collective, metrics)
                metrics["publish_started"], metrics["publish_s"] = t_publish, time.time() - t_publish
                if reporter is not None:
                    reporter.send(TrainerReport(step=step, version=step, consumed=consumed, metrics=metrics))
    finally:
        reader.close()
    if collective is not None:  # not on a failure: the error that ended training is the one to report
        collective.close()
    return _save_final(job, policy, reporter, rank, gate)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="PPO/GRPO trainer process (one rank; torchrun for several)")
    parser.add_argument("--config", required=True, help="path to a TrainerJob JSON file (areal/trainer/config.py)")
    parser.add_argument("--resume", action="store_true", help="continue from the latest checkpoint in run_dir")
    args = parser.parse_args(argv)
    job = TrainerJob.from_json(Path(args.config).read_text())
    if args.resume:
        job = dataclasses.replace(job, trainer=dataclasses.replace(job.trainer, resume=True))
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    reporter = Reporter(job.report_addr)  # every rank may report its own failure
    try:
        _init_distributed(rank, world, job.trainer.parallel, job.trainer.collective_timeout_s)
        train(job, reporter if rank == 0 else None, rank, world)
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
