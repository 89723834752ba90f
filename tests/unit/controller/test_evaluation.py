"""The statistics a run's summary uses to say whether the reward really rose, and the console
lines of an evaluation while it runs."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from instant_engine import start_instant_engine
from transformers import AutoTokenizer

from areal.controller.evaluation import Progress, evaluate, reward_trend
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
