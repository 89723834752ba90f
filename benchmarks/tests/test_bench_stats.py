"""Run statistics of the end-to-end and async benchmarks (`benchmarks/e2e.py:run_stats`) on a
hand-made run directory whose throughput, staleness, drift, calls per episode and trainer idle
time are known: the figures the report shows for a real run are derived exactly as documented."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from areal.protocol import TokenRow, Trajectory, encode_trajectory, frame
from benchmarks.e2e import run_stats


def _traj(episode: str, created: float, version: int, drift: int = 0, row_turns: list[int] | None = None) -> Trajectory:
    rows = []
    for _ in range(len(row_turns) if row_turns else 1):
        mask = np.array([0, 0, 1, 1], dtype=np.uint8)
        rows.append(
            TokenRow(np.arange(4, dtype=np.int32), mask, np.zeros(4, np.float32), np.where(mask == 1, version, -1).astype(np.int32), 1.0)
        )
    return Trajectory.from_rows(
        episode_id=episode,
        group_id="g",
        group_size=1,
        reward=1.0,
        status="ok",
        rows=rows,
        drift=drift,
        created=created,
        row_turns=row_turns,
    )


def _write_run(run_dir: Path) -> None:
    run_dir.mkdir()
    trajs = [
        _traj("e1", 95.0, 0),
        _traj("e2", 96.0, 0),
        _traj("e3", 105.0, 0),
        _traj("e4", 108.0, 1, drift=1, row_turns=[2, 1]),
        _traj("e5", 119.0, 1),
        _traj("late", 125.0, 2),
    ]
    (run_dir / "trajectories.bin").write_bytes(b"".join(frame(encode_trajectory(t)) for t in trajs))
    (run_dir / "metrics.jsonl").write_text(
        "".join(json.dumps({"step": s, "time": t, "step_s": 2.0}) + "\n" for s, t in ((1, 100.0), (2, 110.0), (3, 120.0)))
    )
    (run_dir / "trained_episodes-r0.jsonl").write_text(
        "".join(json.dumps({"step": s, "episodes": e}) + "\n" for s, e in ((1, ["e1", "e2"]), (2, ["e3", "e4"]), (3, ["e5"])))
    )


def test_run_stats_of_a_known_run(tmp_path: Path) -> None:
    _write_run(tmp_path / "run")
    s = run_stats(tmp_path / "run")
    assert s["steps"] == 3 and s["span_s"] == pytest.approx(20.0)
    assert s["steps_per_s"] == pytest.approx(2 / 20)
    assert s["episodes_per_s"] == pytest.approx(3 / 20)  # e3, e4, e5 built inside (first step, last step]
    # staleness = (step - 1) - lowest sampling version: e1, e2 0; e3 1; e4 0; e5 1 (untrained "late" left out)
    assert s["staleness_hist"] == {0: 3, 1: 2} and s["staleness_mean"] == pytest.approx(0.4) and s["staleness_max"] == 1
    assert s["trained"] == 5 and s["drift_rate"] == pytest.approx(0.2)
    assert s["calls_per_episode"] == pytest.approx(7 / 5)  # e4 folded 3 calls into 2 rows; the others 1
    # idle: step 2 waited 8 s (last trajectory at 108, step 1 at 100), step 3 waited 9 s but an
    # interval of 10 s with a 2 s step leaves at most 8 s of waiting; step 1 (start-up) left out
    assert s["idle_s"] == pytest.approx(16.0) and s["idle_fraction"] == pytest.approx(0.8)


def test_run_stats_needs_two_steps(tmp_path: Path) -> None:
    _write_run(tmp_path / "run")
    metrics = tmp_path / "run" / "metrics.jsonl"
    metrics.write_text(metrics.read_text().splitlines()[0] + "\n")
    with pytest.raises(ValueError, match="at least 2"):
        run_stats(tmp_path / "run")
