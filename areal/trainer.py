"""The GRPO trainer process: ring -> groups -> packed micro-batches -> step -> weights -> engines.

    controller --Trajectory bytes--> shared-memory ring --RingReader.get--> GroupCollector
        --complete groups--> pack_rows --micro-batches--> train_step (GRPO, AdamW)
        --> run_dir/weights/v{version} (atomic rename) --POST /update_weights_from_disk--> engines
        --> TrainerReport (ZeroMQ PUSH) --> controller

Run as ``python -m areal.trainer --config trainer.json`` (a JSON ``TrainerConfig``).

Invariants:
- Versions: the initial model is version 0; the weights after optimizer step ``s`` are version
  ``s``. A ``TrainerReport(step=s, version=s)`` is sent only after every engine answered success
  for version ``s``; a failed update is a ``TrainerFailed`` and a non-zero exit, never a skip.
- A step trains on exactly ``groups_per_step`` complete groups (``group_size`` trajectories with
  one ``group_id``), taken in the order they completed. Records of groups still incomplete stay
  in memory for later steps; nothing read from the ring is dropped. ``consumed`` counts records
  read from the ring (including those held for a later step).
- Packing: the rows of a micro-batch are concatenated into one (1, L) sequence without padding;
  ``position_ids`` restart at 0 for each row and the attention mask is left to transformers,
  which, given ``position_ids``, no ``attention_mask`` and no KV cache, builds a block-diagonal
  causal mask, so attention never crosses rows (tests/test_trainer.py checks packed == per-row).
- The logit at position t-1 scores token t; only tokens with ``loss_mask`` 1 are scored, and the
  lm head runs only at those positions (``logits_to_keep``). Dropout is off (``model.eval()``) so
  the trainer's logprobs are comparable with the engine's.
- The loss is the mean over all trained tokens of the step, whatever the micro-batching.
- Weight dirs are written to ``.tmp-v{version}`` and renamed, so an engine never sees a partial
  dir; only the newest ``keep_versions`` dirs are kept.

Not covered yet: several ranks (``WORLD_SIZE`` > 1 raises; the rank is threaded through so that
gradient all-reduce and per-rank rings slot in), resuming from a checkpoint (optimizer state is
not saved), NCCL weight broadcast.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import sys
import time
import traceback
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import msgspec
import numpy as np
import torch
import zmq

from areal.loss import group_advantages, grpo_loss, token_entropy, token_logprobs
from areal.protocol import Trajectory, TrainerDone, TrainerFailed, TrainerMessage, TrainerReport, decode_trajectory


@dataclass
class TrainerConfig:
    """Everything one trainer process needs; the controller writes it as ``run_dir/trainer_config.json``."""

    model_path: str  # initial HF model dir (config, weights, tokenizer files if any)
    ring_name: str  # shared-memory ring this rank reads Trajectory records from
    engine_urls: list[str]  # inference servers to push weights to (SGLang protocol); may be empty
    report_addr: str  # ZeroMQ address the trainer PUSHes TrainerReport/Done/Failed to
    run_dir: str  # weights/, final/, trainer_metrics.jsonl live here
    steps: int  # optimizer steps to run
    groups_per_step: int  # complete groups (prompts) per optimizer step
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
        for name in ("steps", "groups_per_step", "threads", "micro_batch_tokens", "keep_versions"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"trainer.{name} must be an integer >= 1, got {getattr(self, name)!r}")
        for name in ("lr", "temperature", "max_grad_norm", "record_timeout_s", "engine_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"trainer.{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 < self.clip_eps < 1:
            raise ValueError(f"trainer.clip_eps must be in (0, 1), got {self.clip_eps!r}")
        if not self.weight_decay >= 0:
            raise ValueError(f"trainer.weight_decay must be >= 0, got {self.weight_decay!r}")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=2)

    @classmethod
    def from_json(cls, text: str) -> TrainerConfig:
        data = json.loads(text)
        unknown = set(data) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ValueError(f"unknown trainer config fields: {sorted(unknown)}")
        return cls(**data)


class WeightUpdateError(RuntimeError):
    """An engine did not confirm /update_weights_from_disk."""


class GroupCollector:
    """Reads records from a ring and hands out complete groups, keeping partial ones for later."""

    def __init__(self, reader: object, record_timeout_s: float) -> None:
        self.reader = reader  # areal.buffer.RingReader (duck-typed: get(timeout_s) -> bytes | None)
        self.record_timeout_s = record_timeout_s
        self.consumed = 0
        self.pending: dict[str, list[Trajectory]] = {}  # insertion order = first-seen order
        self.complete: list[str] = []  # group ids in completion order

    def next_batch(self, groups: int) -> list[Trajectory]:
        """Block until ``groups`` groups are complete; return their trajectories, group by group."""
        while len(self.complete) < groups:
            buf = self.reader.get(timeout_s=self.record_timeout_s)
            if buf is None:
                raise TimeoutError(
                    f"no trajectory arrived in {self.record_timeout_s}s "
                    f"({self.consumed} consumed, {len(self.pending)} groups pending)"
                )
            self.consumed += 1
            self._add(decode_trajectory(buf))
        taken, self.complete = self.complete[:groups], self.complete[groups:]
        return [t for g in taken for t in self.pending.pop(g)]

    def _add(self, traj: Trajectory) -> None:
        members = self.pending.setdefault(traj.group_id, [])
        if len(members) >= traj.group_size:
            raise ValueError(f"group {traj.group_id!r} got more than group_size={traj.group_size} records")
        members.append(traj)
        if len(members) == traj.group_size:
            self.complete.append(traj.group_id)


@dataclass
class MicroBatch:
    """Rows packed into one sequence; per-token fields cover the scored positions only."""

    input_ids: torch.Tensor  # (1, L) long
    position_ids: torch.Tensor  # (1, L) long, restarting at 0 per row
    pred_pos: torch.Tensor  # (N,) positions whose logits score the next token
    targets: torch.Tensor  # (N,) the scored tokens
    behaviour: torch.Tensor  # (N,) engine logprobs of the targets
    advantages: torch.Tensor  # (N,)
    versions: torch.Tensor  # (N,) policy version that sampled each target
    rows: int = 0


def pack_rows(trajs: list[Trajectory], advantages: torch.Tensor, micro_batch_tokens: int) -> list[MicroBatch]:
    """Greedily pack every row with at least one trained token into micro-batches, in order."""
    parts: list[list[tuple]] = [[]]
    used = 0
    for traj, adv in zip(trajs, advantages.tolist()):
        for row in traj.rows():
            n = len(row.input_ids)
            if not row.loss_mask.any():
                continue  # nothing to train (e.g. a failed episode's prompt-only row)
            if row.loss_mask[0]:
                raise ValueError(f"episode {traj.episode_id}: a row starts with a sampled token (no prompt)")
            if used and used + n > micro_batch_tokens:
                parts.append([])
                used = 0
            parts[-1].append((row, adv))
            used += n
    return [_build_micro_batch(p) for p in parts if p]


def _build_micro_batch(rows: list[tuple]) -> MicroBatch:
    ids, pos, pred, tgt, beh, adv, ver = [], [], [], [], [], [], []
    offset = 0
    for row, a in rows:
        n = len(row.input_ids)
        ids.append(row.input_ids)
        pos.append(np.arange(n))
        scored = np.nonzero(row.loss_mask[1:])[0] + 1  # token t is scored by the logit at t-1
        pred.append(offset + scored - 1)
        tgt.append(row.input_ids[scored])
        beh.append(row.logprobs[scored])
        ver.append(row.versions[scored])
        adv.append(np.full(len(scored), a, dtype=np.float32))
        offset += n

    def cat(xs: list[np.ndarray], dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.concatenate(xs).astype(np.int64 if dtype == torch.long else np.float32))

    return MicroBatch(
        input_ids=cat(ids, torch.long)[None],
        position_ids=cat(pos, torch.long)[None],
        pred_pos=cat(pred, torch.long),
        targets=cat(tgt, torch.long),
        behaviour=cat(beh, torch.float32),
        advantages=cat(adv, torch.float32),
        versions=cat(ver, torch.long),
        rows=len(rows),
    )


def micro_batch_logits(model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
    """Logits at the scored positions, (N, V). use_cache=False keeps the packed-sequence mask."""
    out = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False, logits_to_keep=mb.pred_pos)
    return out.logits[0]


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trajs: list[Trajectory],
    config: TrainerConfig,
    version: int,
) -> dict[str, float]:
    """One GRPO optimizer step on ``trajs`` (complete groups) under policy ``version``."""
    rewards = torch.tensor([t.reward for t in trajs], dtype=torch.float32)
    adv = group_advantages(rewards, [t.group_id for t in trajs])
    batches = pack_rows(trajs, adv, config.micro_batch_tokens)
    total = sum(len(mb.targets) for mb in batches)
    optimizer.zero_grad(set_to_none=True)
    loss_sum = clip_sum = ratio_sum = kl_sum = ent_sum = 0.0
    ratio_max, diff_cur, diff_all, stale_sum, n_cur = 0.0, 0.0, 0.0, 0.0, 0
    for mb in batches:
        logits = micro_batch_logits(model, mb)  # (N, V)
        lp = token_logprobs(logits, mb.targets, config.temperature)
        loss, st = grpo_loss(lp, mb.behaviour, mb.advantages, torch.ones_like(lp), config.clip_eps)
        (loss * (st["tokens"] / total)).backward()  # mean over all tokens of the step
        w = st["tokens"]
        loss_sum += loss.item() * w
        clip_sum += st["clip_frac"] * w
        ratio_sum += st["ratio_mean"] * w
        kl_sum += st["approx_kl"] * w
        ratio_max = max(ratio_max, st["ratio_max"])
        ent_sum += float(token_entropy(logits.detach(), config.temperature).sum())
        diff = (lp.detach() - mb.behaviour).abs()
        cur = mb.versions == version
        diff_all = max(diff_all, float(diff.max()))
        if bool(cur.any()):
            diff_cur = max(diff_cur, float(diff[cur].max()))
            n_cur += int(cur.sum())
        stale_sum += float((version - mb.versions).sum())
    grad_norm = 0.0  # no trained token: no optimizer step
    if total:
        grad_norm = float(torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm, error_if_nonfinite=True))
        optimizer.step()
    denom = max(total, 1)
    metrics = {
        "loss": loss_sum / denom,
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std(unbiased=False)),
        "adv_nonzero_frac": float((adv != 0).float().mean()),
        "clip_frac": clip_sum / denom,
        "ratio_mean": ratio_sum / denom,
        "ratio_max": ratio_max,
        "approx_kl": kl_sum / denom,
        "grad_norm": grad_norm,
        "entropy": ent_sum / denom,
        "staleness_mean": stale_sum / denom,
        "tokens": float(total),
        "trajectories": float(len(trajs)),
        "micro_batches": float(len(batches)),
    }
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


def push_weights(urls: list[str], model_dir: Path, version: int, timeout_s: float) -> None:
    """POST /update_weights_from_disk to every engine; raise WeightUpdateError unless all succeed."""
    body = json.dumps({"model_path": str(model_dir), "weight_version": str(version)}).encode()
    for url in urls:
        req = urllib.request.Request(
            url.rstrip("/") + "/update_weights_from_disk", data=body, method="POST",
            headers={"Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout_s) as resp:
                reply = json.loads(resp.read() or b"{}")
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


def train(config: TrainerConfig, reporter: Reporter, rank: int = 0) -> Path:
    """Run ``config.steps`` GRPO steps; returns the final model dir."""
    from transformers import AutoModelForCausalLM  # imported here: 1 s, unneeded by config users

    from areal.buffer import RingReader

    torch.set_num_threads(config.threads)
    torch.manual_seed(config.seed)
    run_dir = Path(config.run_dir)
    weights_dir = run_dir / "weights"
    weights_dir.mkdir(parents=True, exist_ok=True)
    model = AutoModelForCausalLM.from_pretrained(config.model_path, dtype=torch.float32)
    model.eval()  # no dropout: trainer logprobs must match the engine's
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    reader = RingReader(config.ring_name, timeout_s=config.record_timeout_s)
    try:
        collector = GroupCollector(reader, config.record_timeout_s)
        for step in range(1, config.steps + 1):
            trajs = collector.next_batch(config.groups_per_step)
            t0 = time.perf_counter()
            metrics = train_step(model, optimizer, trajs, config, version=step - 1)
            metrics["step_s"] = time.perf_counter() - t0
            model_dir = save_atomically(model, weights_dir / f"v{step}", config.model_path)
            push_weights(config.engine_urls, model_dir, step, config.engine_timeout_s)
            prune_versions(weights_dir, step, config.keep_versions)
            metrics["pending_trajectories"] = float(sum(len(v) for v in collector.pending.values()))
            with open(run_dir / "trainer_metrics.jsonl", "a") as f:
                f.write(json.dumps({"step": step, "version": step, "consumed": collector.consumed, **metrics}) + "\n")
            reporter.send(TrainerReport(step=step, version=step, consumed=collector.consumed, metrics=metrics))
    finally:
        reader.close()
    final = save_atomically(model, run_dir / "final", config.model_path)
    reporter.send(TrainerDone(steps=config.steps, model_dir=str(final)))
    return final


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="GRPO trainer process")
    parser.add_argument("--config", required=True, help="path to a TrainerConfig JSON file")
    args = parser.parse_args(argv)
    config = TrainerConfig.from_json(Path(args.config).read_text())
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    reporter = Reporter(config.report_addr)
    try:
        if world != 1:
            raise ValueError(f"WORLD_SIZE={world}: this trainer runs a single rank; launch it without torchrun or with --nproc_per_node=1")
        train(config, reporter, rank)
    except Exception:  # process boundary: tell the controller why, then die non-zero
        error = traceback.format_exc()
        print(error, file=sys.stderr, flush=True)
        reporter.send(TrainerFailed(rank=rank, error=error))
        return 1
    finally:
        reporter.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
