"""What a run leaves on disk stays readable and its own: a cut ``trajectories.bin`` still gives
every complete record (and says where it was cut), and a second run into the same directory is
refused instead of appending its steps and episodes to the first run's (a killed one is continued:
tests/unit/controller/test_resume.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from run_checks import one_step_run, run_in_repo

from areal.controller.trajectories import read_saved_trajectories


def _train(run_dir: Path, *extra: str) -> subprocess.CompletedProcess:
    cmd = one_step_run(run_dir, "trainer.steps=2", "rollout.groups_per_step=1", "rollout.n_samples=2", "save_trajectories=true", *extra)
    return run_in_repo(cmd, timeout_s=300)


@pytest.mark.e2e
def test_a_cut_file_keeps_its_complete_records_and_a_run_dir_holds_one_run(tmp_path):
    run_dir = tmp_path / "run"
    first = _train(run_dir)
    assert first.returncode == 0, first.stderr[-3000:]
    saved = run_dir / "trajectories.bin"
    whole = read_saved_trajectories(saved)
    assert len(whole) == 4  # 2 steps x 1 group x 2 samples
    data = saved.read_bytes()
    for cut_at, kept in ((len(data) - 10, 3), (2, 0)):  # inside the last record; inside the first header
        cut = tmp_path / f"cut-{cut_at}.bin"
        cut.write_bytes(data[:cut_at])
        with pytest.warns(UserWarning, match=f"cut at byte .* of {cut_at} .*the {kept} complete records"):
            part = read_saved_trajectories(cut)
        assert [t.episode_id for t in part] == [t.episode_id for t in whole[:kept]]

    metrics = (run_dir / "metrics.jsonl").read_text()
    second = _train(run_dir)  # recover.mode=auto (the default) continues a killed run, not a finished one
    assert second.returncode != 0
    assert f"run directory {run_dir} holds a finished run (summary.json)" in second.stderr, second.stderr[-3000:]
    third = _train(run_dir, "recover.mode=off")
    assert third.returncode != 0
    assert f"run directory {run_dir} already holds a run (metrics.jsonl with 2 lines" in third.stderr, third.stderr[-3000:]
    assert (run_dir / "metrics.jsonl").read_text() == metrics  # the first run's records untouched
