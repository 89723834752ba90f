"""Trackers (logger=[jsonl, console, wandb, tensorboard]): a real short run, launched as a one-job
Hydra sweep, writes W&B's offline run and TensorBoard's event files, read back here with no network
(the .wandb file parsed record by record, the event files with TensorBoard's EventAccumulator) and
compared with metrics.jsonl; the AReaL spellings select the same trackers; the episode sample."""

from __future__ import annotations

import json
import math
import struct
import warnings
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from run_checks import read_jsonl, run_ok, sweep_cmd

from areal.config import TrainConfig
from areal.controller.trackers import TrackerConfig, Trackers, WandbConfig


def read_wandb_file(path: Path) -> list[Any]:
    """The records of a ``.wandb`` file: W&B's LevelDB-style log (7-byte header ":W&B", 0xBEE1,
    version; 32 KiB blocks of chunks: CRC32, length, type FULL=1 FIRST=2 MIDDLE=3 LAST=4), each
    record a ``wandb_internal_pb2.Record``."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw = path.read_bytes()
    assert struct.unpack("<4sHB", raw[:7]) == (b":W&B", 0xBEE1, 0)
    records, pos, chunks = [], 7, b""
    while pos + 7 <= len(raw):
        left = 32768 - pos % 32768
        if left < 7:  # a block's tail too short for a chunk header is padding
            pos += left
            continue
        _crc, n, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if n == 0 and kind == 0:
            pos += left
            continue
        chunks += raw[pos + 7 : pos + 7 + n]
        pos += 7 + n
        if kind in (1, 4):
            record = pb.Record()
            record.ParseFromString(chunks)
            records.append(record)
            chunks = b""
    return records


def _history(records: list[Any]) -> dict[int, dict[str, Any]]:
    rows: dict[int, dict[str, Any]] = {}
    for r in records:
        if r.WhichOneof("record_type") == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
            rows.setdefault(int(items["_step"]), {}).update(items)
    return rows


@pytest.mark.e2e
def test_a_short_sweep_run_writes_wandb_and_tensorboard_files_offline(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, TENSORS, EventAccumulator

    sweep_dir = tmp_path / "sweep"
    cmd = sweep_cmd(
        sweep_dir,
        "seed=1",
        "experiment_name=trk",
        "model.path=scripted",
        "rollout.openai.mode=inline",
        "trainer.steps=3",
        "trainer.lr_scheduler=cosine",
        "rollout.groups_per_step=1",
        "rollout.n_samples=2",
        "data.eval_size=2",
        "data.eval_samples=1",
        "logger=[jsonl,console,wandb,tensorboard]",
        "tracker.episodes_per_step=2",
    )
    proc = run_ok(cmd, timeout_s=600)
    run_dir = sweep_dir / "0"
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    lr = 3e-5  # the default trainer.lr; cosine over 3 updates, no warm-up
    assert [m["lr"] for m in metrics] == pytest.approx([lr * 0.5 * (1 + math.cos(math.pi * k / 3)) for k in range(3)])
    evals = read_jsonl(run_dir / "evals.jsonl")
    assert [(e["name"], e["step"], e["n"]) for e in evals] == [("before", 0, 2), ("after", 3, 2)]
    assert "step 1 (v1) | reward_mean" in proc.stdout and "eval after (step 3) | n 2" in proc.stdout  # console
    episode_ids = {json.loads(line)["episode_id"] for line in (run_dir / "episodes.jsonl").read_text().splitlines()}

    # W&B: one offline run under the run dir, grouped by the sweep, with the resolved config.
    (wandb_dir,) = (run_dir / "wandb").glob("offline-run-*")
    (wandb_file,) = wandb_dir.glob("run-*.wandb")
    records = read_wandb_file(wandb_file)
    (run,) = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert (run.project, run.run_group, run.display_name) == ("trk", "trk/sweep", "0")
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    assert config["trainer"]["lr_scheduler"] == "cosine" and config["logger"] == ["jsonl", "console", "wandb", "tensorboard"]
    assert config["tracker"]["wandb"]["group"] == "trk/sweep"
    history = _history(records)
    for m in metrics:  # every number of metrics.jsonl at its step
        row = history[m["step"]]
        for key, value in m.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and key not in ("step", "time"):
                assert row[key] == pytest.approx(value), (m["step"], key)
    assert history[0]["eval/before/n"] == 2 and history[3]["eval/after/n"] == 2 and "eval/after/sampled_acc" in history[3]
    tables = [(step, row) for step, row in history.items() if row.get("episodes/_type") == "table-file"]
    # A table with each step after which episodes had finished (the first step's always had).
    table_steps = [step for step, _ in tables]
    assert table_steps[0] == 1 and set(table_steps) <= {1, 2, 3}
    table = json.loads((wandb_dir / "files" / tables[0][1]["episodes/path"]).read_text())
    assert table["columns"] == ["episode_id", "status", "reward", "n_calls", "prompt", "calls", "error"]
    assert 1 <= len(table["data"]) <= 2 and all(row[0] in episode_ids for row in table["data"])
    assert all(row[3] >= 1 and row[4] and row[5].startswith("[1] ") for row in table["data"] if row[1] == "ok")
    (exit_record,) = [r.exit for r in records if r.WhichOneof("record_type") == "exit"]
    assert exit_record.exit_code == 0

    # TensorBoard: the same scalars, the evaluations, the episode tables and the config as text.
    acc = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={SCALARS: 0, TENSORS: 0})
    acc.Reload()
    for key in ("reward_mean", "loss", "lr", "grad_norm", "version"):
        events = acc.Scalars(key)
        assert [e.step for e in events] == [1, 2, 3], key
        assert [e.value for e in events] == pytest.approx([m[key] for m in metrics], rel=1e-6), key
    assert [(e.step, e.value) for e in acc.Scalars("eval/before/n")] == [(0, 2.0)]
    assert [e.step for e in acc.Scalars("eval/after/sampled_acc")] == [3]
    texts = {tag: [(e.step, e.tensor_proto.string_val[0].decode()) for e in acc.Tensors(tag)] for tag in acc.Tags()["tensors"]}
    assert [step for step, _ in texts["episodes/text_summary"]] == table_steps
    assert texts["episodes/text_summary"][0][1].startswith("| episode_id | status | reward | n_calls | prompt | calls | error |")
    assert any(e in texts["episodes/text_summary"][0][1] for e in episode_ids)
    assert '"lr_scheduler": "cosine"' in texts["config/text_summary"][0][1]


def test_areal_stats_logger_keys_select_the_trackers():
    from areal.api.cli_args import AReaLKeysIgnored, GRPOConfig, load_expr_config
    from areal.experimental.trainer import to_train_config

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config, _ = load_expr_config(
            [
                "stats_logger.wandb.mode=offline",
                "stats_logger.wandb.project=p",
                "stats_logger.wandb.tags=[a,b]",
                "stats_logger.wandb.id_suffix=train",
                "stats_logger.tensorboard.path=/tmp/tb",
                "actor.optimizer.lr_scheduler_type=cosine",
                "actor.optimizer.warmup_steps_proportion=0.25",
                "total_train_steps=8",
            ],
            GRPOConfig,
        )
    (ignored,) = [w.message.ignored for w in caught if isinstance(w.message, AReaLKeysIgnored)]
    assert set(ignored) == {"stats_logger.wandb.id_suffix"} and "run id" in ignored["stats_logger.wandb.id_suffix"]
    tcfg = to_train_config(config, "m:A", 10, 0, True)
    assert tcfg.logger == ["jsonl", "wandb", "tensorboard"]
    w = tcfg.tracker.wandb
    assert (w.mode, w.project, w.tags, w.name, tcfg.tracker.tensorboard.path) == ("offline", "p", ["a", "b"], "", "/tmp/tb")
    assert (tcfg.trainer.lr_scheduler, tcfg.trainer.warmup_steps) == ("cosine", 2)  # 0.25 x 8 updates
    plain, _ = load_expr_config([], GRPOConfig)
    assert to_train_config(plain, "m:A", 10, 0, True).logger == ["jsonl"]  # wandb.mode: disabled, no tensorboard.path
    with pytest.raises(ValueError, match="stats_logger.wandb.mode"):
        load_expr_config(["stats_logger.wandb.mode=shared"], GRPOConfig)


def test_the_logger_list_is_validated_naming_the_key():
    with pytest.raises(ValueError, match="logger must list distinct trackers"):
        TrainConfig(logger=["jsonl", "mlflow"])
    with pytest.raises(ValueError, match="logger must list distinct trackers"):
        TrainConfig(logger=["wandb", "wandb"])
    with pytest.raises(ValueError, match="tracker.wandb.mode"):
        WandbConfig(mode="disabled")  # leaving wandb out of `logger` is how it is off
    with pytest.raises(ValueError, match="tracker.episodes_per_step"):
        TrackerConfig(episodes_per_step=-1)


class TableBackend:
    """A backend that keeps what it is given (the facade's side of the Tracker protocol)."""

    tables = True

    def __init__(self) -> None:
        self.tables_logged: list[list[dict]] = []

    def log_step(self, step: int, row: dict) -> None:
        pass

    def log_eval(self, name: str, scalars: dict, step: int) -> None:
        pass

    def log_table(self, name: str, rows: list[dict], step: int) -> None:
        self.tables_logged.append(rows)

    def close(self, ok: bool) -> None:
        pass


def test_the_episode_sample_is_uniform_and_builds_only_the_sampled_rows():
    counts: Counter[int] = Counter()
    for seed in range(400):
        backend = TableBackend()
        trackers = Trackers([backend], episodes_per_step=4, seed=seed)
        built: list[int] = []

        def row(i: int) -> dict:
            built.append(i)
            return {"episode_id": i, "prompt": "x" * 5000, "reward": float("nan")}

        for i in range(20):
            trackers.offer_episode(lambda i=i: row(i))
        trackers.log_step({"step": 1})
        (table,) = backend.tables_logged
        assert len(built) == 4 and sorted(r["episode_id"] for r in table) == sorted(built)
        assert all(len(r["prompt"]) < 2100 and r["reward"] is None for r in table)  # cut; NaN as None
        counts.update(built)
        trackers.log_step({"step": 2})  # nothing finished since: no table
        assert len(backend.tables_logged) == 1
    # 400 draws of 4 of 20: each episode is expected 80 times; the first ones are not favoured.
    assert set(counts) == set(range(20)) and max(counts.values()) < 120 and min(counts.values()) > 45, counts
