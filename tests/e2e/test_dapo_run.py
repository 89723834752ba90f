"""DAPO's dynamic sampling and soft overlong punishment in a whole run (docs/algorithms.md): 3
synchronous steps of 2 groups of 4 on the scripted model, with an agent whose groups are mostly
of equal rewards (tests/support/dapo_agent.py). Every trained group has unequal rewards, the
dropped groups are logged as dropped and counted per step, the run finishes its steps, every
published episode is trained exactly once, and each trained reward carries the penalty of its
call's length under the max_tokens the gateway recorded for that call."""

from __future__ import annotations

from collections import Counter, defaultdict
from pathlib import Path

import pytest
from dapo_agent import CUT, LIMIT
from paths import ROOT
from run_checks import check_trained_as_sampled, read_jsonl, run_ok, three_step_run

from areal.controller.trajectories import read_saved_trajectories

pytestmark = pytest.mark.e2e

AGENT = ROOT / "tests" / "support" / "dapo_agent.py"
CACHE = 32  # rollout.overlong_penalty_tokens
# inline on the scripted model, groups of 4, dynamic sampling and the soft overlong penalty on
DAPO_RUN = (
    "model.path=scripted",
    "rollout.openai.mode=inline",
    f"rollout.agent={AGENT}:run",
    "rollout.n_samples=4",
    "rollout.dynamic_sampling=true",
    f"rollout.overlong_penalty_tokens={CACHE}",
)


def test_dynamic_sampling_and_overlong_penalty(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    run_ok(
        three_step_run(
            run_dir,
            *DAPO_RUN,
        ),
        timeout_s=600,
    )
    published = check_trained_as_sampled(run_dir)  # 3 steps, versions, each published episode trained exactly once

    groups: dict[str, list[float]] = defaultdict(list)
    penalised = 0
    for t in published:
        groups[t.group_id].append(t.reward)
        (row,) = t.rows()  # one call per episode
        n = int(row.loss_mask.sum())
        limit = CUT if n == CUT else LIMIT
        cache = min(CACHE, limit)  # an interval longer than the call's limit is cut to it
        penalty = min(0.0, max(-1.0, ((limit - cache) - n) / cache))  # by hand: DAPO's formula
        penalised += penalty < 0
        assert row.reward == t.reward and min(abs(t.reward - penalty - raw) for raw in (0.0, 1.0)) < 1e-5, (n, t.reward)
    assert len(groups) == 6 and all(len(rewards) == 4 for rewards in groups.values())
    assert all(len(set(rewards)) >= 2 for rewards in groups.values())  # every trained group can train something

    episodes = read_jsonl(run_dir / "episodes.jsonl")
    dropped = [e for e in episodes if "dropped" in e]
    dropped_groups = {e["group_id"] for e in dropped}
    assert dropped and {e["dropped"] for e in dropped} == {"dynamic_sampling"}
    assert not dropped_groups & set(groups) and not {e["episode_id"] for e in dropped} & {t.episode_id for t in published}
    assert all(sum(e["group_id"] == g for e in dropped) == 4 for g in dropped_groups)  # logged whole, never lost

    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert sum(m["groups_dropped"] for m in metrics) == len(dropped_groups)
    assert sum(m["groups_sampled"] for m in metrics) == len(dropped_groups) + len(groups)
    assert all(m["dynamic_sampling_exhausted"] == 0 for m in metrics)
    assert sum(m["overlong_penalised_rows"] for m in metrics) == penalised > 0
    assert sum(m["overlong_filtered_rows"] for m in metrics) == 0  # rollout.overlong_filter is off


def test_overlong_filter_masks_truncated_calls(tmp_path: Path) -> None:
    """With rollout.overlong_filter too, the calls cut by their max_tokens are published with no
    trained token (and the penalty at the limit, -1), counted per step; the trainer trains exactly
    the published episodes and the tokens left in the loss."""
    run_dir = tmp_path / "run"
    run_ok(
        three_step_run(
            run_dir,
            *DAPO_RUN,
            "rollout.overlong_filter=true",
        ),
        timeout_s=600,
    )
    published = read_saved_trajectories(run_dir / "trajectories.bin")
    filtered = 0
    for t in published:
        (row,) = t.rows()
        if not row.loss_mask.any():  # cut at CUT tokens: masked, and penalised -1 (raw 0 or 1)
            filtered += 1
            assert t.reward in (-1.0, 0.0)
        else:
            assert int(row.loss_mask.sum()) > CUT
    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2, 3]
    assert sum(m["overlong_filtered_rows"] for m in metrics) == filtered > 0
    trained = Counter(e for s in read_jsonl(run_dir / "trained_episodes-r0.jsonl") for e in s["episodes"])
    assert set(trained) == {t.episode_id for t in published} and max(trained.values()) == 1
    tokens = sum(m["tokens"] for m in read_jsonl(run_dir / "trainer_metrics.jsonl"))
    assert tokens == sum(int(t.array("loss_mask").sum()) for t in published)  # the filtered tokens left the loss
