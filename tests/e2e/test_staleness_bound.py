"""The staleness bound, asserted end to end (docs/algorithms.md): at the default bound (1) and at
2, no token a step trains was sampled more than ``rollout.max_head_offpolicyness`` versions
before the weights that step starts from; the trainer's staleness metric is computed from the
versions recorded per token; and the rollout correction's mismatch is nil where every token is
current, and where some are stale it is the mismatch between the logprobs recorded with each token
and the ones the weights the step starts from give (recomputed here from the saved weights: how
far a confident token's logprob moves is the model's business, not the test's). Inline agents on
the embedded model, at a learning rate that moves it."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from late_agent import MARKER, WAIT_FOR_STEP
from paths import ROOT
from run_checks import read_jsonl, run_ok, train_cmd
from trainer_harness import behaviour_logprobs
from transformers import AutoModelForCausalLM

from areal.controller.trajectories import read_saved_trajectories
from areal.embedded import ensure_embedded_model
from areal.protocol import Trajectory

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("bound", [1, 2])
def test_no_trained_token_is_older_than_the_bound(tmp_path: Path, bound: int) -> None:
    run_dir = tmp_path / "run"
    run_ok(
        train_cmd(
            run_dir,
            "rollout.openai.mode=inline",
            "trainer.lr=1e-3",
            "trainer.steps=5",
            "rollout.groups_per_step=2",
            f"rollout.max_head_offpolicyness={bound}",
            "data.eval_size=0",
            "save_trajectories=true",
            "trainer.rollout_correction=token_tis",
            "trainer.keep_versions=10",  # every version's weights stay, for the recomputation below
        ),
        timeout_s=600,
    )
    saved = {t.episode_id: t for t in read_saved_trajectories(run_dir / "trajectories.bin")}
    versions = {e: t.array("versions") for e, t in saved.items()}
    trained = read_jsonl(run_dir / "trained_episodes-r0.jsonl")
    metrics = {m["step"]: m for m in read_jsonl(run_dir / "trainer_metrics.jsonl")}
    assert [t["step"] for t in trained] == [1, 2, 3, 4, 5]
    for t in trained:
        start = t["step"] - 1  # the version of the weights step k starts from
        sampled = [int(v) for e in t["episodes"] for v in versions[e] if v >= 0]  # -1: prompt tokens
        assert sampled and min(sampled) >= start - bound, (t["step"], min(sampled), bound)
        assert max(sampled) <= start  # nothing from the future
        assert metrics[t["step"]]["staleness_max"] == start - min(sampled)  # the metric reads the recorded versions
        m = metrics[t["step"]]
        assert math.isfinite(m["rc_kl"]) and 0 < m["rc_weight_mean"] <= 2.0
        if start == min(sampled):  # every token sampled by the weights the step starts from: on policy
            assert m["rc_log_ratio_absmax"] < 1e-3 and abs(m["rc_kl"]) < 1e-6
        else:  # tokens of older weights: the mismatch is the one the step's starting weights give
            weights = run_dir / "weights" / f"v{start}" if start else ensure_embedded_model(progress=False)
            expected = _largest_log_ratio(weights, [saved[e] for e in t["episodes"]])
            assert m["rc_log_ratio_absmax"] == pytest.approx(expected, rel=1e-3, abs=1e-4), (t["step"], expected)


def _largest_log_ratio(weights: Path, episodes: list[Trajectory]) -> float:
    """max |logprob under ``weights`` - recorded logprob| over the sampled tokens of ``episodes``,
    one plain forward per row (no packing, no trainer code; the run samples at temperature 1)."""
    model = AutoModelForCausalLM.from_pretrained(weights, dtype=torch.float32).eval()
    largest = 0.0
    for t in episodes:
        ids, sampled, recorded = t.array("input_ids"), t.array("loss_mask") == 1, t.array("logprobs")
        bounds = np.cumsum(np.concatenate([[0], t.array("row_lens")]))
        for a, b in zip(bounds[:-1], bounds[1:], strict=True):
            if sampled[a:b].any():
                lp = behaviour_logprobs(model, ids[a:b].tolist(), temperature=1.0)
                largest = max(largest, float(np.abs(lp - recorded[a:b])[sampled[a:b]].max()))
    return largest


def test_a_group_that_finishes_after_two_newer_versions_is_run_again_not_trained(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Admission bounds the version a group starts at, but groups finish out of order. One group
    (tests/support/late_agent.py) samples its tokens at version 0 and ends only once step 2 is
    logged, so it is the third group published: step 3 would train it from version 2, two
    versions after its tokens, over a bound of 1. It must not be trained; its prompt runs again."""
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.setenv("LATE_AGENT_RUN_DIR", str(run_dir))
    run_ok(
        train_cmd(
            run_dir,
            "rollout.openai.mode=inline",
            f"rollout.agent={ROOT / 'tests' / 'support' / 'late_agent.py'}:run",
            "trainer.steps=4",
            "rollout.groups_per_step=1",
            "rollout.n_samples=2",
            "rollout.max_head_offpolicyness=1",
            "data.eval_size=0",
            "save_trajectories=true",
        ),
        timeout_s=600,
    )
    question = (run_dir / MARKER).read_text()
    episodes = read_jsonl(run_dir / "episodes.jsonl")
    trained = read_jsonl(run_dir / "trained_episodes-r0.jsonl")
    assert WAIT_FOR_STEP < len(trained)
    versions = {t.episode_id: t.array("versions") for t in read_saved_trajectories(run_dir / "trajectories.bin")}
    for t in trained:  # the bound holds for every step (a step starts from version step - 1)
        sampled = [int(v) for e in t["episodes"] for v in versions[e] if v >= 0]
        assert min(sampled) >= t["step"] - 1 - 1, (t["step"], min(sampled))
    stale = {e["group_id"] for e in episodes if e.get("dropped") == "stale"}
    assert len(stale) == 1, f"one group (the late one) is dropped as stale, not {sorted(stale)}"
    late_group = stale.pop()
    dropped = [e for e in episodes if e["group_id"] == late_group]
    assert all(e.get("dropped") == "stale" for e in dropped if e["status"] == "ok"), dropped
    assert question in {e["data"]["question"] for e in dropped}
    again = [e for e in episodes if e["group_id"] == f"{late_group}-stale"]
    assert len(again) == 2 and not any(e.get("dropped") for e in again), again  # the prompt ran again, and was trained
    assert again[0]["data"]["question"] == question  # the same row
    trained_ids = {e for t in trained for e in t["episodes"]}
    assert not trained_ids & {e["episode_id"] for e in dropped}
    assert {e["episode_id"] for e in again} <= trained_ids
    assert sum(m["stale_groups"] for m in read_jsonl(run_dir / "metrics.jsonl")) == 1
