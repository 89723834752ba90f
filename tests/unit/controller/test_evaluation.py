"""The statistics a run's summary uses to say whether the reward really rose, the console
lines of an evaluation while it runs (the time spent and left, then a summary), and what
data.eval_mode scores with."""

from __future__ import annotations

import asyncio
import re

import numpy as np
import pytest
from instant_engine import start_instant_engine
from transformers import AutoTokenizer

from areal.config import DataConfig, RolloutConfig
from areal.controller.evaluation import Progress, evaluate, resolve_eval_mode, reward_trend
from areal.embedded import ensure_embedded_model
from areal.engine.client import EngineClient


def test_trend_fits_a_line_through_the_step_rewards() -> None:
    t = reward_trend(list(np.linspace(0.2, 0.5, 31)))
    assert t["fit_start"] == pytest.approx(0.2) and t["fit_end"] == pytest.approx(0.5)
    assert t["slope"] == pytest.approx(0.01) and t["p_value"] < 0.001 and t["window_p_value"] < 0.01


def test_trend_of_noise_or_decline_is_not_significant() -> None:
    noise = list(np.random.default_rng(3).normal(0.3, 0.09, size=200))
    assert reward_trend(noise)["p_value"] > 0.05
    falling = reward_trend(list(np.linspace(0.5, 0.2, 40)))
    assert falling["fit_end"] < falling["fit_start"] and falling["p_value"] > 0.99


def test_small_rise_in_noisy_batches_is_found_by_the_trend() -> None:
    # 250 steps, per-step noise 0.09 (what the embedded run shows), a true rise of 0.08 (z ~ 4).
    rng = np.random.default_rng(0)
    r = np.linspace(0.27, 0.35, 250) + rng.normal(0, 0.09, size=250)
    t = reward_trend(list(r))
    assert t["p_value"] < 0.05 and t["fit_end"] > t["fit_start"]


def test_progress_prints_a_line_as_it_starts_and_one_per_tenth_done() -> None:
    lines: list[str] = []
    progress = Progress("before training", 25, "replies", lines.append, "5 problems x 4 sampled + 1 greedy", heartbeat_s=1e9)
    for _ in range(25):
        progress.advance()
    assert lines[0] == "[eval] before training: 0/25 replies (5 problems x 4 sampled + 1 greedy)"
    assert [line.split(",")[0] for line in lines[1:]] == [
        f"[eval] before training: {d}/25 replies" for d in (3, 5, 8, 10, 13, 15, 18, 20, 23, 25)
    ]


def test_progress_lines_say_the_time_spent_and_left_and_a_summary_line_ends_it() -> None:
    """A clock of the test's own: 10 s per reply, so after d of 5 replies 10 d s are spent and
    10 (5 - d) s are left; the summary says how long it took, what it cost and the scores."""
    lines: list[str] = []
    now = [100.0]
    progress = Progress("before training", 5, "episodes", lines.append, "the run's agent", heartbeat_s=1e9, clock=lambda: now[0])
    for _ in range(5):
        now[0] += 10.0
        progress.advance()
    assert lines[1:] == [
        "[eval] before training: 1/5 episodes, 10 s, about 40 s left",
        "[eval] before training: 2/5 episodes, 20 s, about 30 s left",
        "[eval] before training: 3/5 episodes, 30 s, about 20 s left",
        "[eval] before training: 4/5 episodes, 40 s, about 10 s left",
        "[eval] before training: 5/5 episodes, 50 s",
    ]
    progress.finish({"wall_s": 50.0, "sampled_tokens": 321, "sampled_acc": 0.25, "greedy_acc": 0.5, "mode": "agent"}, "0 failed")
    assert lines[-1] == (
        "[eval] before training: done in 50 s (5 episodes, 321 tokens sampled): sampled_acc 0.250, greedy_acc 0.500 (agent); 0 failed"
    )
    # a long one reads in minutes and hours; a slow stretch between tenths still shows a line
    lines.clear()
    now[0] = 0.0
    slow = Progress("after training (v3)", 1000, "replies", lines.append, heartbeat_s=30.0, clock=lambda: now[0])
    now[0] = 125.0
    slow.advance()  # 1 of 1000 after 125 s: no new tenth, but the heartbeat is due
    assert lines[-1] == "[eval] after training (v3): 1/1000 replies, 2 min 05 s, about 34 h 41 min left"


def test_a_beating_progress_writes_lines_while_nothing_is_done() -> None:
    """An evaluation whose first reply takes minutes is not silent: inside ``beating()`` a line
    comes whenever ``heartbeat_s`` passed without one (here the test waits for two such lines)."""
    lines: list[str] = []

    async def run() -> None:
        progress = Progress("before training", 3, "replies", lines.append, heartbeat_s=0.02)
        async with progress.beating():
            while len(lines) < 3:  # the start line and two heartbeats, none of the replies done
                await asyncio.sleep(0.01)
            progress.advance()
        count = len(lines)
        await asyncio.sleep(0.1)
        assert len(lines) == count  # the heartbeat ends with the evaluation

    asyncio.run(asyncio.wait_for(run(), 60))
    assert all(re.fullmatch(r"\[eval\] before training: 0/3 replies, [^,]+, waiting for the first", line) for line in lines[1:3]), lines
    assert any(re.fullmatch(r"\[eval\] before training: 1/3 replies, [^,]+, about .+ left", line) for line in lines[3:]), lines


def test_eval_mode_auto_follows_the_runs_agent_and_explicit_modes_stand() -> None:
    builtin = RolloutConfig.agent
    mine = "my_agents/word_problems.py:Solver"
    assert resolve_eval_mode("auto", builtin, builtin, "spec")[0] == "single_turn"  # the built-in task
    mode, why = resolve_eval_mode("auto", mine, builtin, "spec")
    assert mode == "agent" and f"rollout.agent={mine}" in why  # the user's agent, named on the console
    assert resolve_eval_mode("auto", builtin, builtin, "agent")[0] == "agent"  # an AgentWorkflow object handed to the run
    assert resolve_eval_mode("auto", mine, builtin, "rollout")[0] == "single_turn"  # a RolloutWorkflow has no runner
    assert resolve_eval_mode("single_turn", mine, builtin, "spec") == ("single_turn", "data.eval_mode=single_turn")
    assert resolve_eval_mode("agent", builtin, builtin, "spec") == ("agent", "data.eval_mode=agent")
    with pytest.raises(ValueError, match="data.eval_mode=agent .* RolloutWorkflow"):
        resolve_eval_mode("agent", mine, builtin, "rollout")
    assert DataConfig().eval_mode == "auto"
    with pytest.raises(ValueError, match="data.eval_mode must be one of \\('auto', 'single_turn', 'agent'\\)"):
        DataConfig(eval_mode="agentic")


def test_a_single_turn_evaluation_prints_its_progress_while_it_runs() -> None:
    """The engine answers the first 4 of 10 requests and holds the rest: the lines of those 4
    are on the console while the evaluation still waits; the last line comes with the end."""
    tok = AutoTokenizer.from_pretrained(ensure_embedded_model(progress=False))
    problems = [{"question": f"What is {i} + 1?", "answer": str(i + 1)} for i in range(5)]
    lines: list[str] = []

    async def run() -> tuple[list[str], bool, dict]:
        release, answered = asyncio.Event(), []

        async def hold() -> None:
            answered.append(1)
            if len(answered) > 4:
                await release.wait()

        engine = await start_instant_engine(tok, "\\boxed{1}", on_call=hold)
        client = EngineClient(f"http://127.0.0.1:{engine.addresses[0][1]}")
        try:
            progress = Progress("before training", 10, "replies", lines.append, heartbeat_s=1e9)
            task = asyncio.create_task(evaluate(client, tok, problems, 1.0, samples=1, progress=progress))
            while progress.done < 4:
                await asyncio.sleep(0.01)  # bounded by the wait_for around run()
            during, running = list(lines), not task.done()
            release.set()
            return during, running, await asyncio.wait_for(task, 60)
        finally:
            await client.close()
            await engine.cleanup()

    during, running, result = asyncio.run(asyncio.wait_for(run(), 120))
    assert running and [line.split(",")[0] for line in during] == [f"[eval] before training: {d}/10 replies" for d in range(5)]
    assert lines[-1].startswith("[eval] before training: 10/10 replies") and len(lines) == 11
    assert result["n"] == 5 and result["sampled_acc"] == 0.2  # "\\boxed{1}" answers the first problem only
    # what it cost: its wall time, and the tokens the engine sampled (every reply the same text and <|im_end|>)
    assert result["mode"] == "single_turn" and result["wall_s"] >= 0
    assert result["sampled_tokens"] == 10 * (len(tok.encode("\\boxed{1}", add_special_tokens=False)) + 1)
