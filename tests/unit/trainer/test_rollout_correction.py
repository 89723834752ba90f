"""Rollout correction and clip-higher (areal/trainer/loss.py, step.py), against values computed
exactly: the corrected policy gradient equals the true one where the uncorrected one does not;
each mode's weights on a hand-made case; the upper clip moves alone; one step of the trainer
logs the mismatch."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from areal.protocol import TokenRow, Trajectory
from areal.trainer.config import TrainerConfig
from areal.trainer.loss import decoupled_ppo_loss, grpo_loss, rollout_correction
from areal.trainer.step import make_policy_loss


def _exact_gradients(correct: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """A categorical policy p = softmax(theta) over 5 tokens and advantages A; tokens are sampled
    by another policy q (the engine's). The expectation over x ~ q of the loss's gradient is
    computed exactly, each token weighted by q(x) (the loss averages with the mask's weights).
    Returns (that expected gradient, the true policy gradient of -E_p[A])."""
    theta = torch.tensor([0.3, -1.0, 0.5, 2.0, -0.2], dtype=torch.float64, requires_grad=True)
    q = torch.softmax(torch.tensor([1.0, 0.0, -0.5, 0.4, 0.3], dtype=torch.float64), 0)
    adv = torch.tensor([1.0, -2.0, 0.5, -0.3, 1.5], dtype=torch.float64)
    logp = torch.log_softmax(theta, 0)
    tokens = torch.arange(5)
    prox = logp.detach()  # the step's starting weights: the trained policy itself
    correction = rollout_correction(prox, q.log(), tokens, "token_tis", cap=math.inf) if correct else None
    beh = q.log() if correct else logp.detach()  # uncorrected: the ratio is taken as if p had sampled
    loss, _ = decoupled_ppo_loss(logp, prox, beh, adv, q, clip_eps=0.2, correction=correction)
    (got,) = torch.autograd.grad(loss, theta)
    p = logp.exp().detach()
    want = -(p * adv - p * (p * adv).sum())  # d/dtheta of -sum_x p(x) A(x) for a softmax
    return got, want


def test_the_corrected_gradient_is_the_true_one_and_the_uncorrected_is_not():
    got, want = _exact_gradients(correct=True)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-7)  # the loss mask is float32: q(x) rounded there
    biased, want = _exact_gradients(correct=False)
    assert (biased - want).abs().max() > 0.1  # sampled by q, trained as if by p


def test_each_mode_weighs_and_rejects_as_defined():
    prox = torch.log(torch.tensor([0.5, 0.5, 0.2, 0.9]))
    beh = torch.log(torch.tensor([0.1, 0.5, 0.4, 0.3]))  # token ratios 5, 1, 0.5, 3
    rows = torch.tensor([0, 0, 1, 1])  # row ratios 5 and 1.5
    w, st = rollout_correction(prox, beh, rows, "token_tis", cap=2.0)
    torch.testing.assert_close(w, torch.tensor([2.0, 1.0, 0.5, 2.0]))
    assert st["rc_affected_frac"] == pytest.approx(0.5) and st["rc_log_ratio_absmax"] == pytest.approx(math.log(5))
    w, _ = rollout_correction(prox, beh, rows, "seq_tis", cap=2.0)
    torch.testing.assert_close(w, torch.tensor([2.0, 2.0, 1.5, 1.5]))
    w, st = rollout_correction(prox, beh, rows, "token_mis", cap=2.0, floor=0.6)
    torch.testing.assert_close(w, torch.tensor([0.0, 1.0, 0.0, 0.0]))
    assert st["rc_affected_frac"] == pytest.approx(0.75)
    w, _ = rollout_correction(prox, beh, rows, "seq_mis", cap=2.0)
    torch.testing.assert_close(w, torch.tensor([0.0, 0.0, 1.5, 1.5]))
    lr = (prox - beh).double()
    want_kl = float((lr.exp() - 1 - lr).mean())
    assert rollout_correction(prox, beh, rows, "token_tis", cap=2.0)[1]["rc_kl"] == pytest.approx(want_kl)
    with pytest.raises(ValueError, match="rollout correction mode"):
        rollout_correction(prox, beh, rows, "none", cap=2.0)


def test_clip_higher_moves_only_the_upper_bound():
    lp = torch.log(torch.tensor([1.25, 1.25, 0.75])).requires_grad_()  # ratios against behaviour 0
    adv = torch.tensor([1.0, 1.0, -1.0])
    for high, grads in ((None, [0.0, 0.0, 0.0]), (0.28, [1.25, 1.25, 0.0])):
        lp.grad = None
        loss, _ = grpo_loss(lp, torch.zeros(3), adv, torch.ones(3), clip_eps=0.2, clip_eps_high=high)
        (loss * 3).backward()
        torch.testing.assert_close(-lp.grad, torch.tensor(grads))  # the ratio 0.75 < 0.8 with A < 0 stays clipped


def test_grpo_with_a_correction_on_policy_is_grpo():
    """With behaviour = the trainer's logprobs the weights are 1 and the ratio against the
    proximal is the ratio against the behaviour: the same loss and gradient as plain grpo."""
    torch.manual_seed(0)
    base = torch.randn(6, dtype=torch.float64)
    adv, rows = torch.randn(6, dtype=torch.float64), torch.tensor([0, 0, 0, 1, 1, 1])
    grads = []
    for correction in ("none", "seq_tis", "token_mis"):
        lp = base.clone().requires_grad_()
        loss_fn = make_policy_loss(TrainerConfig(rollout_correction=correction))
        loss, st = loss_fn(lp, lp.detach(), base.clone(), adv, rows)
        loss.backward()
        grads.append(lp.grad)
        assert correction == "none" or st["rc_weight_mean"] == pytest.approx(1.0)
    torch.testing.assert_close(grads[0], grads[1])
    torch.testing.assert_close(grads[0], grads[2])


def test_a_step_logs_the_mismatch_and_bad_settings_are_named():
    from tiny_models import tiny_qwen2

    from areal.trainer.packing import PolicyScorer
    from areal.trainer.step import train_step

    model = tiny_qwen2()
    rng = np.random.default_rng(0)
    trajs = []
    for i in range(4):
        mask = np.r_[np.zeros(6), np.ones(10)].astype(np.uint8)
        row = TokenRow(
            rng.integers(0, 300, 16).astype(np.int32), mask, (-6.0 * mask).astype(np.float32), (mask.astype(np.int32) - 1) * (1 - mask), 0.0
        )
        trajs.append(Trajectory.from_rows(episode_id=str(i), group_id="g", group_size=4, reward=float(i % 2), status="ok", rows=[row]))
    scorer = PolicyScorer(model, 1.0)
    opt = torch.optim.AdamW(scorer.parameters(), lr=1e-4)
    config = TrainerConfig(rollout_correction="token_tis", rollout_correction_cap=2.0, micro_batch_tokens=32)
    m = train_step(scorer, opt, trajs, config, version=0)
    # behaviour logprobs of -6 against a random 300-token model's ~-5.7: ratios above 1, truncated at 2 where over
    assert m["rc_log_ratio_mean"] > 0 and 0 < m["rc_weight_mean"] <= 2.0 and m["rc_kl"] > 0
    assert m["rc_log_ratio_absmax"] >= m["rc_log_ratio_mean"] and 0 <= m["rc_affected_frac"] <= 1
    for over in (
        {"loss_agg": "seq_mean_token_mean", "ratio_level": "sequence"},
        {"loss_agg": "seq_mean_token_sum_norm", "loss_agg_norm_tokens": 64},
    ):
        other = train_step(scorer, opt, trajs, TrainerConfig(micro_batch_tokens=32, **over), version=0)
        assert math.isfinite(other["loss"]) and other["grad_norm"] > 0 and other["tokens"] == m["tokens"]
    for bad, match in (
        ({"rollout_correction": "tis"}, "trainer.rollout_correction"),
        ({"rollout_correction_cap": 0.5}, "rollout_correction_cap"),
        ({"loss": "ppo", "behav_weight_cap": 2.0, "rollout_correction": "token_tis"}, "not both"),
        ({"clip_eps_high": -0.1}, "clip_eps_high"),
    ):
        with pytest.raises(ValueError, match=match):
            TrainerConfig(**bad)


def test_gspo_clips_one_ratio_per_row_and_scales_each_tokens_gradient_by_it():
    """GSPO's token form: every token of a row carries the row's geometric-mean ratio, and the
    gradient at each token is that ratio times the token's logprob gradient."""
    from areal.trainer.loss import sequence_ratio_logprobs

    lp = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.5], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([-1.5, -1.0, -0.5, -2.0, -2.5], dtype=torch.float64)
    rows = torch.tensor([0, 0, 0, 1, 1])
    ratio = torch.exp(sequence_ratio_logprobs(lp, old, rows) - old)
    s0, s1 = math.exp((0.5 - 1.0 + 0.0) / 3), math.exp((-1.0 + 1.0) / 2)
    torch.testing.assert_close(ratio.detach(), torch.tensor([s0, s0, s0, s1, s1], dtype=torch.float64))
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0], dtype=torch.float64)
    (ratio * weights).sum().backward()
    torch.testing.assert_close(lp.grad, weights * torch.tensor([s0, s0, s0, s1, s1], dtype=torch.float64))
    config = TrainerConfig(ratio_level="sequence", clip_eps=0.1)  # one row's ratio 0.85 < 0.9: its tokens all clip at once
    loss, st = make_policy_loss(config)(lp.detach().clone(), old, old, torch.full((5,), -1.0, dtype=torch.float64), rows)
    assert st["clip_frac"] == pytest.approx(3 / 5)


@pytest.mark.parametrize("agg", ["token_mean", "seq_mean_token_mean", "seq_mean_token_sum_norm"])
def test_each_aggregation_is_the_mean_its_paper_writes(agg):
    """Rows of 1 and 3 tokens, on policy (ratio 1: the per-token loss is -A): the trainer's token
    mean over the scaled advantages is the aggregation as defined, value and gradient."""
    from areal.trainer.loss import aggregation_scale

    rows = torch.tensor([0, 1, 1, 1])
    adv = torch.tensor([2.0, -1.0, 0.5, 3.0])
    per_token = -adv
    want = {
        "token_mean": per_token.mean(),
        "seq_mean_token_mean": (per_token[:1].mean() + per_token[1:].mean()) / 2,
        "seq_mean_token_sum_norm": per_token.sum() / (2 * 8),  # 2 rows, a constant of 8 tokens
    }[agg]
    scaled = adv * aggregation_scale(rows, agg, total_tokens=4.0, total_rows=2.0, norm_tokens=8)
    lp = torch.zeros(4, requires_grad=True)
    loss, _ = grpo_loss(lp, torch.zeros(4), scaled, torch.ones(4), clip_eps=0.2)
    torch.testing.assert_close(loss.detach(), want)
    loss.backward()
    expected_grad = {
        "token_mean": -adv / 4,
        "seq_mean_token_mean": -adv * torch.tensor([1 / 2, 1 / 6, 1 / 6, 1 / 6]),
        "seq_mean_token_sum_norm": -adv / 16,
    }[agg]
    torch.testing.assert_close(lp.grad, expected_grad)
    with pytest.raises(ValueError, match="loss_agg_norm_tokens"):
        TrainerConfig(loss_agg="seq_mean_token_sum_norm")
