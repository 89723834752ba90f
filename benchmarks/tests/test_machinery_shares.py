"""benchmarks/machinery.py's share arithmetic on a made-up run directory: the window runs from the
first optimizer step to the end of the last weight push; compute is the union of the engine's
generate spans and the trainer's steps; machinery is the rest of the window, and its part inside
weight pushes (the trainer publishing, an engine loading) is counted once where they overlap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.machinery import gaps, machinery_of, overlap, union


def test_interval_helpers() -> None:
    assert union([(3, 4), (0, 1), (0.5, 2), (5, 5)]) == [(0, 2), (3, 4)]
    assert gaps([(1, 2), (3, 4)], 0, 5) == [(0, 1), (2, 3), (4, 5)]
    assert overlap([(0, 2), (3, 4)], [(1, 3.5)]) == pytest.approx(1.5)


def test_shares_of_a_run(tmp_path: Path) -> None:
    spans = [
        {"kind": "generate", "start": 0.0, "end": 9.0},  # before the window: cut at 10
        {"kind": "generate", "start": 9.5, "end": 12.0},
        {"kind": "load", "start": 14.0, "end": 15.0},
        {"kind": "generate", "start": 15.0, "end": 18.0},
    ]
    (tmp_path / "engine_busy-0.jsonl").write_text("".join(json.dumps(s) + "\n" for s in spans))
    steps = [
        {"step": 1, "step_started": 10.0, "step_s": 3.0, "publish_started": 13.0, "publish_s": 1.5},
        {"step": 2, "step_started": 17.0, "step_s": 2.0, "publish_started": 19.0, "publish_s": 1.0},
    ]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in steps))
    m = machinery_of(tmp_path)
    # window [10, 20]; compute: generate [10,12] + [15,18], trainer [10,13] + [17,19] -> [10,13] + [15,19] = 7 s
    assert m["window_s"] == pytest.approx(10.0)
    assert m["machinery"] == pytest.approx(0.3)  # [13,15] and [19,20]
    assert m["in_pushes"] == pytest.approx(0.3)  # pushes [13,15] (publish 13-14.5 and load 14-15) and [19,20]
    assert m["generating"] == pytest.approx(0.5) and m["training"] == pytest.approx(0.5)
    assert m["timeline"]["engine generates"][0] == [0.0, 2.0]


def test_a_run_without_the_busy_log_is_named(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("")
    with pytest.raises(ValueError, match="engine.busy_log=true"):
        machinery_of(tmp_path)
