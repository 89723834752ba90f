"""The statistics a run's summary uses to say whether the reward really rose."""

from __future__ import annotations

import numpy as np
import pytest

from areal.evaluation import reward_trend


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
