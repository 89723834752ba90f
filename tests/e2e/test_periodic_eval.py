"""Evaluation during training (data.eval_every) and the best checkpoint (best/): a real short run
on the embedded model checked for the steps and versions of its evaluations and for best/ being
the weights of the step its metric ranks first; the keeping of weights the trainer prunes; the
settings refused with their field named; AReaL's evaluator.freq_steps."""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from run_checks import read_jsonl, run_in_repo, train_cmd
from safetensors.torch import load_file

from areal.config import DataConfig, TrainConfig
from areal.controller.periodic_eval import PeriodicEval
from areal.controller.records import RunRecords
from areal.controller.trackers import open_trackers
from areal.embedded import ensure_embedded_model

STEPS = 4


def _train(run_dir: Path, *overrides: str) -> subprocess.CompletedProcess:
    cmd = train_cmd(
        run_dir,
        f"trainer.steps={STEPS}",
        "rollout.groups_per_step=2",
        "rollout.n_samples=4",
        "rollout.openai.mode=inline",
        "data.eval_size=6",
        "data.eval_samples=2",
        *overrides,
    )
    return run_in_repo(cmd, timeout_s=300)


def _tensors(model_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(model_dir / "model.safetensors")


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.e2e
def test_a_run_evaluates_every_step_and_keeps_the_best_steps_weights(tmp_path):
    run_dir = tmp_path / "run"
    proc = _train(run_dir, "data.eval_every=1", "trainer.keep_versions=8", "data.eval_best_metric=greedy_acc")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    evals = read_jsonl(run_dir / "evals.jsonl")
    periodic = [e for e in evals if e["name"] == "periodic"]
    assert [e["name"] for e in evals] == ["before", *["periodic"] * len(periodic), "after"]
    # Each step before the last was evaluated once, or skipped (the previous evaluation still
    # ran) with a line saying so; the last step is the "after" evaluation, not evaluated twice.
    skipped = [int(s) for s in re.findall(r"\[eval\] step (\d+) skipped", proc.stdout + proc.stderr)]
    assert periodic and sorted([e["step"] for e in periodic] + skipped) == list(range(1, STEPS))
    for e in periodic:
        assert e["version"] == e["step"] and e["step"] <= e["served_version_min"] <= e["served_version_max"] <= STEPS
        assert e["n"] == 6 and 0 <= e["greedy_acc"] <= 1 and 0 <= e["sampled_acc"] <= 1
    assert evals[-1]["step"] == STEPS

    # best.json names the first step the metric ranks highest among the trained versions.
    candidates = [e for e in evals if e["name"] != "before"]
    top = max(e["greedy_acc"] for e in candidates)
    winner = next(e for e in candidates if e["greedy_acc"] == top)
    best = json.loads((run_dir / "best" / "best.json").read_text())
    assert (best["metric"], best["mode"], best["step"], best["version"], best["model"]) == (
        "greedy_acc",
        "max",
        winner["step"],
        winner["step"],
        True,
    )
    assert best["value"] == pytest.approx(top)
    assert json.loads((run_dir / "summary.json").read_text())["best"] == best

    # best/ is an HF model directory holding exactly that version's weights, no other's.
    kept = _tensors(run_dir / "best")
    assert (run_dir / "best" / "config.json").is_file() and (run_dir / "best" / "tokenizer_config.json").is_file()
    versions = {k: _tensors(run_dir / "weights" / f"v{k}") for k in range(1, STEPS + 1)}
    assert [k for k, w in versions.items() if _same(w, kept)] == [best["version"]]
    assert not list(run_dir.glob(".best-*"))  # no stage left behind


@pytest.mark.e2e
def test_off_by_default_and_bad_settings_are_refused_naming_the_field(tmp_path):
    assert DataConfig().eval_every == 0
    for kwargs, field in (
        ({"eval_every": -1}, "data.eval_every"),
        ({"eval_every": 1.5}, "data.eval_every"),
        ({"eval_every": True}, "data.eval_every"),
        ({"eval_best_metric": "accuracy"}, "data.eval_best_metric"),
        ({"eval_best_mode": "maximum"}, "data.eval_best_mode"),
    ):
        with pytest.raises(ValueError, match=field):
            DataConfig(**kwargs)
    # Nothing to evaluate: refused before any process starts, from Python and from the command line.
    from areal.controller.loop import train

    rows = [{"question": "1+1?", "answer": "2"}]
    with pytest.raises(ValueError, match="data.eval_every=2 .*no held-out rows"):
        asyncio.run(train(TrainConfig(data=DataConfig(eval_every=2)), tmp_path / "py", dataset=rows))
    proc = _train(tmp_path / "cli", "data.eval_size=0", "data.eval_every=2")
    assert proc.returncode != 0 and "data.eval_every=2 evaluates during training, but the run has no held-out rows" in proc.stderr


def test_areals_evaluator_freq_steps_is_the_evaluation_interval(tmp_path):
    from areal.api.cli_args import AReaLKeysIgnored, GRPOConfig, load_expr_config
    from areal.experimental.trainer import to_train_config

    path = tmp_path / "config.yaml"
    path.write_text(
        f"experiment_name: x\ntrial_name: t\ncluster: {{fileroot: {tmp_path}}}\nevaluator: {{freq_epochs: 1, freq_steps: 3, freq_secs: null}}\n"
    )
    with pytest.warns(AReaLKeysIgnored) as caught:
        config, _ = load_expr_config(["--config", str(path)], GRPOConfig)
    ignored = caught[0].message.ignored
    assert "evaluator.freq_epochs" in ignored and "evaluator.freq_steps" not in ignored
    assert to_train_config(config, "m:A", 10, 4, True).data.eval_every == 3
    with pytest.warns(AReaLKeysIgnored):
        config, _ = load_expr_config(["--config", str(path), "evaluator.freq_steps=null"], GRPOConfig)
    assert to_train_config(config, "m:A", 10, 4, True).data.eval_every == 0


def _published(weights: Path, version: int) -> Path:
    """A published version, as the trainer leaves it: an HF model directory weights/v{version}."""
    target = weights / f"v{version}"
    shutil.copytree(ensure_embedded_model(), target)
    return target


def test_weights_pruned_after_the_report_are_kept_and_missing_ones_are_named(tmp_path):
    """The module on its own, its evaluation scripted (the decision and the files are tested here,
    not the model): v2 is pruned while it is evaluated, yet best/ holds it; v3 was never written
    (trainer.weight_sync=collective), so when it wins best/ says why it has no model; the last
    step competes with the "after" evaluation's result, from final/."""
    config = TrainConfig(data=DataConfig(eval_every=1, eval_best_mode="min"))
    config.trainer.steps = 4
    lines: list[str] = []
    scores = {2: 0.5, 3: 0.25}
    current: dict[str, int] = {}

    async def evaluate() -> dict:
        step = current["step"]
        if step == 2:
            shutil.rmtree(tmp_path / "weights" / "v2")  # the trainer prunes it meanwhile
        await asyncio.sleep(0)
        return {"n": 1, "sampled_acc": scores[step], "greedy_acc": 0.0, "served_versions": [step]}

    async def run() -> dict | None:
        tracker = open_trackers(config.logger, config.tracker, tmp_path, config.experiment_name, {}, config.seed)
        records = RunRecords(tmp_path, tracker, save_trajectories=False, view_record_mb=config.view_record_mb, steps=config.trainer.steps)
        try:
            d = config.data
            pe = PeriodicEval(
                tmp_path,
                records,
                evaluate,
                lines.append,
                every=d.eval_every,
                steps=config.trainer.steps,
                metric=d.eval_best_metric,
                mode=d.eval_best_mode,
            )
            original = _tensors(_published(tmp_path / "weights", 2))
            current["step"] = 2
            pe.on_report(2, 2)
            await pe.drain()
            assert not (tmp_path / "weights" / "v2").exists() and _same(_tensors(tmp_path / "best"), original)
            assert json.loads((tmp_path / "best" / "best.json").read_text())["step"] == 2
            current["step"] = 3
            pe.on_report(3, 3)  # lower is better (eval_best_mode=min): 0.25 wins, without weights
            await pe.drain()
            best = json.loads((tmp_path / "best" / "best.json").read_text())
            assert (best["step"], best["model"]) == (3, False) and "weights/v3 does not exist" in best["why_no_model"]
            assert sorted(p.name for p in (tmp_path / "best").iterdir()) == ["best.json"]  # never two steps mixed
            pe.on_report(4, 4)  # the last step: the "after" evaluation covers it
            assert pe.task is None or pe.task.done()
            final = _published(tmp_path, 0).rename(tmp_path / "final")
            return pe.after({"n": 1, "sampled_acc": 0.125, "greedy_acc": 0.0}, 4, str(final))
        finally:
            records.close(True)

    best = asyncio.run(run())
    assert (best["step"], best["model"]) == (4, True) and (tmp_path / "best" / "model.safetensors").is_file()
    assert any("step 3 is the best so far, but its weights cannot be kept" in line for line in lines)
    rows = read_jsonl(tmp_path / "evals.jsonl")
    assert [(r["name"], r["step"], r["version"]) for r in rows] == [("periodic", 2, 2), ("periodic", 3, 3)]
    assert not list(tmp_path.glob(".best-*"))
