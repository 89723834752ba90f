"""Hydra sweeps: `python -m areal.train -m ...` runs isolated runs and writes a sweep summary.

The two-run sweep is real (engine, gateway, trainer processes per run, inline agents, 2 steps);
the summary rebuild is also checked on its own against run directories laid out like Hydra's.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import threading
from pathlib import Path

import pytest
from paths import ROOT
from run_checks import sweep_cmd

from areal.sweep import collect_runs, write_sweep_summary


@pytest.mark.e2e
def test_two_run_sweep_writes_a_table_and_a_plot(tmp_path):
    sweep_dir = tmp_path / "sweep"
    cmd = sweep_cmd(
        sweep_dir,
        "trainer.lr=1e-5,3e-5",
        "trainer.steps=2",
        "rollout.groups_per_step=1",
        "rollout.n_samples=2",
        "data.eval_size=0",
        "rollout.openai.mode=inline",
    )
    out = subprocess.run(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    runs = sorted(p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isdigit())
    assert [p.name for p in runs] == ["0", "1"]
    configs = [json.loads((p / "config.json").read_text()) for p in runs]
    assert [c["trainer"]["lr"] for c in configs] == [1e-5, 3e-5]
    for p in runs:  # each run finished on its own
        assert len((p / "metrics.jsonl").read_text().splitlines()) == 2

    with open(sweep_dir / "sweep_summary.csv") as f:
        table = list(csv.DictReader(f))
    assert [r["run"] for r in table] == ["0", "1"]
    # Only what tells the runs apart (Hydra writes the swept values back normalised: 1e-05).
    assert [float(r["overrides"].removeprefix("trainer.lr=")) for r in table] == [1e-5, 3e-5]
    for r in table:
        assert r["steps"] == "2" and 0.0 <= float(r["reward_first"]) <= 1.0 and 0.0 <= float(r["reward_last"]) <= 1.0
        assert float(r["wall_s"]) > 0 and r["heldout_before"] == "nan"  # data.eval_size=0: no held-out set
    md = (sweep_dir / "sweep_summary.md").read_text()
    assert f"| 1 | {table[1]['overrides']} | 2 |" in md and "sweep_rewards.png" in md
    assert (sweep_dir / "sweep_rewards.png").stat().st_size > 1000
    assert "2 finished runs" in out.stdout


def _fake_run(run_dir: Path, overrides: list[str], rewards: list[float], eval_acc: tuple[float, float] | None) -> None:
    (run_dir / ".hydra").mkdir(parents=True)
    (run_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": i + 1, "reward_mean": r}) + "\n" for i, r in enumerate(rewards)))
    before, after = ({"sampled_acc": eval_acc[0]}, {"sampled_acc": eval_acc[1]}) if eval_acc else (None, None)
    (run_dir / "summary.json").write_text(json.dumps({"eval_before": before, "eval_after": after, "wall_s": 12.5}))


def test_summary_rebuild_orders_runs_numerically_and_skips_unfinished_ones(tmp_path):
    for i in range(11):
        _fake_run(tmp_path / str(i), ["trainer.steps=4", f"seed={i}"], [0.0, 0.25, 0.5, 1.0], (0.2, 0.4) if i % 2 else None)
    (tmp_path / "11").mkdir()  # crashed: no summary.json
    rows = write_sweep_summary(tmp_path)
    assert [r["run"] for r in rows] == [str(i) for i in range(11)]
    assert rows[3]["overrides"] == "seed=3"
    assert rows[3]["reward_first"] == 0.0 and rows[3]["reward_last"] == 1.0
    assert rows[1]["heldout_before"] == 0.2 and rows[1]["heldout_after"] == 0.4
    assert len((tmp_path / "sweep_summary.csv").read_text().splitlines()) == 12


def test_overlapping_rebuilds_leave_a_complete_summary(tmp_path):
    for i in range(4):
        _fake_run(tmp_path / str(i), [f"trainer.lr={i}e-5"], [0.1 * i, 0.2 * i], None)
    threads = [threading.Thread(target=write_sweep_summary, args=(tmp_path,)) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(collect_runs(tmp_path)) == 4
    lines = (tmp_path / "sweep_summary.csv").read_text().splitlines()
    assert len(lines) == 5 and not list(tmp_path.glob("*.tmp"))
