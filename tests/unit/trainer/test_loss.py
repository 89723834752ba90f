"""Unit tests for areal/trainer/loss.py against hand-computed values."""

import math

import pytest
import torch

from areal.trainer.loss import (
    decoupled_ppo_loss,
    episode_advantages,
    group_advantages,
    grpo_loss,
    head_logprobs,
    kl_estimate,
    token_entropy,
    token_logprobs,
    turn_returns,
)


def test_group_advantages_hand_computed_two_groups():
    # group a: rewards 0, 1 -> mean 0.5, population std 0.5 -> -1, +1
    # group b: rewards 1, 2, 6 -> mean 3, var (4 + 1 + 9) / 3 = 14/3
    rewards = torch.tensor([0.0, 1.0, 2.0, 6.0, 1.0])
    ids = ["a", "a", "b", "b", "b"]
    adv = group_advantages(rewards, ids, eps=0.0)
    sb = math.sqrt(14 / 3)
    expected = torch.tensor([-1.0, 1.0, -1 / sb, 3 / sb, -2 / sb])
    torch.testing.assert_close(adv, expected)


def test_group_advantages_eps_in_denominator():
    adv = group_advantages(torch.tensor([0.0, 1.0]), ["g", "g"], eps=0.5)
    torch.testing.assert_close(adv, torch.tensor([-0.5, 0.5]))  # 0.5 / (0.5 + 0.5)


def test_group_advantages_identical_rewards_are_exactly_zero():
    rewards = torch.tensor([0.1, 0.1, 0.1, 1.0, 0.0, 7.0])
    adv = group_advantages(rewards, ["x", "x", "x", "y", "y", "solo"])
    assert adv[:3].tolist() == [0.0, 0.0, 0.0]
    assert adv[5].item() == 0.0  # a group of one carries no signal
    torch.testing.assert_close(adv[3:5], torch.tensor([1.0, -1.0]), atol=1e-5, rtol=0)


def test_group_advantages_rejects_mismatched_ids():
    with pytest.raises(ValueError):
        group_advantages(torch.tensor([1.0, 2.0]), ["a"])


def _direct(logits: torch.Tensor, targets: torch.Tensor, t: float) -> torch.Tensor:
    return torch.log_softmax(logits / t, dim=-1).gather(-1, targets[:, None]).squeeze(-1)


@pytest.mark.parametrize("temperature", [1.0, 0.7, 2.0])
def test_token_logprobs_matches_direct_and_chunking_is_invisible(temperature):
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(37, 50, generator=g) * 3
    targets = torch.randint(0, 50, (37,), generator=g)
    expected = _direct(logits, targets, temperature)
    for chunk in (1, 5, 37, 1000):
        got = token_logprobs(logits, targets, temperature, chunk_tokens=chunk)
        torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)


def test_token_logprobs_applies_temperature():
    logits = torch.tensor([[2.0, 0.0]])
    targets = torch.tensor([0])
    # softmax([1, 0])[0] = e / (e + 1) at temperature 2
    got = token_logprobs(logits, targets, 2.0)
    assert got.item() == pytest.approx(math.log(math.e / (math.e + 1)), abs=1e-6)
    assert got.item() != pytest.approx(token_logprobs(logits, targets, 1.0).item(), abs=1e-3)


def test_token_logprobs_gradient_matches_autograd_of_direct():
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(11, 23, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 23, (11,), generator=g)
    weights = torch.randn(11, generator=g, dtype=torch.float64)
    a = logits.clone().requires_grad_(True)
    (token_logprobs(a, targets, 0.8, chunk_tokens=4).double() * weights).sum().backward()
    b = logits.clone().requires_grad_(True)
    (_direct(b, targets, 0.8) * weights).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, atol=1e-6, rtol=1e-5)


def test_token_entropy_matches_direct():
    logits = torch.tensor([[0.0, 0.0], [0.0, 100.0]])
    ent = token_entropy(logits, 1.0, chunk_tokens=1)
    torch.testing.assert_close(ent, torch.tensor([math.log(2), 0.0]), atol=1e-6, rtol=0)


def test_grpo_loss_hand_computed_with_clipping_and_mask():
    eps = 0.2
    # token 0: ratio 1.5, A=+1 -> clipped: min(1.5, 1.2) = 1.2
    # token 1: ratio 0.5, A=-1 -> min(-0.5, -0.8) = -0.8 (clipped)
    # token 2: ratio 1.1, A=+2 -> min(2.2, 2.2) = 2.2 (inside the band, not clipped)
    # token 3: ratio 0.5, A=+1 -> min(0.5, 0.8) = 0.5 (unclipped side chosen)
    # token 4: masked out; a huge value must not leak in
    ratios = torch.tensor([1.5, 0.5, 1.1, 0.5, 50.0])
    behaviour = torch.tensor([-1.0, -2.0, -0.5, -3.0, -1.0])
    logprobs = (behaviour + ratios.log()).requires_grad_(True)
    adv = torch.tensor([1.0, -1.0, 2.0, 1.0, 9.0])
    mask = torch.tensor([1, 1, 1, 1, 0], dtype=torch.uint8)
    loss, stats = grpo_loss(logprobs, behaviour, adv, mask, eps)
    expected = -(1.2 - 0.8 + 2.2 + 0.5) / 4
    assert loss.item() == pytest.approx(expected, abs=1e-6)
    assert stats["tokens"] == 4
    assert stats["clip_frac"] == pytest.approx(0.5)
    assert stats["ratio_max"] == pytest.approx(1.5, abs=1e-6)
    assert stats["ratio_min"] == pytest.approx(0.5, abs=1e-6)
    assert stats["ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.1 + 0.5) / 4, abs=1e-6)
    loss.backward()
    # Clipped tokens and masked tokens carry no gradient; others get -A * ratio / n.
    torch.testing.assert_close(logprobs.grad, torch.tensor([0.0, 0.0, -2.0 * 1.1 / 4, -0.5 / 4, 0.0]))


def test_grpo_loss_ratio_one_is_minus_mean_advantage():
    lp = torch.tensor([-1.0, -2.0, -3.0, -4.0])
    adv = torch.tensor([0.5, -2.0, 3.0, 100.0])
    mask = torch.tensor([1.0, 1.0, 1.0, 0.0])
    loss, stats = grpo_loss(lp.clone(), lp, adv, mask, 0.2)
    assert loss.item() == pytest.approx(-(0.5 - 2.0 + 3.0) / 3, abs=1e-6)
    assert stats["clip_frac"] == 0.0
    assert stats["ratio_mean"] == pytest.approx(1.0)


def test_grpo_loss_all_masked_is_zero_not_nan():
    z = torch.zeros(3)
    loss, stats = grpo_loss(z, z, torch.ones(3), z, 0.2)
    assert loss.item() == 0.0
    assert stats["tokens"] == 0.0


def test_turn_returns_hand_computed():
    # G2 = 2; G1 = 0 + 0.5 * 2 = 1; G0 = 1 + 0.5 * 1 = 1.5
    got = turn_returns(torch.tensor([1.0, 0.0, 2.0]), 0.5)
    torch.testing.assert_close(got, torch.tensor([1.5, 1.0, 2.0]))
    torch.testing.assert_close(turn_returns(torch.tensor([1.0, 0.0, 2.0]), 1.0), torch.tensor([3.0, 2.0, 2.0]))
    with pytest.raises(ValueError, match="gamma"):
        turn_returns(torch.tensor([1.0]), 1.5)


def test_episode_advantages_weigh_each_episode_once():
    # Group g: episode A has two rows (returns 1.5, 1.0; weight 1/2 each), episode B one row (0.0).
    # mean = (0.75 + 0.5 + 0) / 2 = 0.625; centred 0.875, 0.375, -0.625
    # var = (0.5 * 0.875^2 + 0.5 * 0.375^2 + 0.625^2) / 2 = 0.421875
    a, b, c = episode_advantages([torch.tensor([1.5, 1.0]), torch.tensor([0.0]), torch.tensor([4.0, 4.0])], ["g", "g", "h"], eps=0.0)
    std = math.sqrt(0.421875)
    torch.testing.assert_close(a, torch.tensor([0.875, 0.375]) / std)
    torch.testing.assert_close(b, torch.tensor([-0.625 / std]))
    assert c.tolist() == [0.0, 0.0]  # a group of one episode: no signal, whatever its rows


def test_episode_advantages_with_one_return_per_episode_equal_group_advantages():
    rewards = torch.tensor([0.0, 1.0, 2.0, 6.0, 1.0])
    ids = ["a", "a", "b", "b", "b"]
    shared = episode_advantages([torch.tensor([r, r, r]) for r in rewards.tolist()], ids)
    expected = group_advantages(rewards, ids)
    for row_adv, e in zip(shared, expected):
        torch.testing.assert_close(row_adv, e.repeat(3))  # every row of an episode shares its advantage


def test_grpo_loss_dual_clip_bounds_negative_advantages():
    # eps 0.2, c 3. token 0: r 5, A -1 -> PPO term -min(-5, -1.2) = 5 -> dual bound 3 (no gradient)
    # token 1: r 2, A -1 -> 2 (below the bound: gradient -A r / n = 2 / 3)
    # token 2: r 5, A +1 -> min(5, 1.2) = 1.2 -> loss -1.2 (clipped, no gradient)
    behaviour = torch.zeros(3)
    logprobs = torch.tensor([5.0, 2.0, 5.0]).log().requires_grad_(True)
    adv = torch.tensor([-1.0, -1.0, 1.0])
    loss, stats = grpo_loss(logprobs, behaviour, adv, torch.ones(3), 0.2, dual_clip=3.0)
    assert loss.item() == pytest.approx((3.0 + 2.0 - 1.2) / 3, abs=1e-6)
    assert stats["clip_frac"] == pytest.approx(2 / 3)
    loss.backward()
    torch.testing.assert_close(logprobs.grad, torch.tensor([0.0, 2.0 / 3, 0.0]))
    plain, _ = grpo_loss(logprobs.detach(), behaviour, adv, torch.ones(3), 0.2)
    assert plain.item() == pytest.approx((5.0 + 2.0 - 1.2) / 3, abs=1e-6)


def test_decoupled_ppo_loss_hand_computed_with_capped_behaviour_weight():
    # token 0: proximal -1, behaviour -2 -> w = e = 2.718 capped at 2; r = 1.1, A = 1 -> -1.1 * 2
    # token 1: proximal -1, behaviour -1 -> w = 1; r = 1.5, A = 1 -> clipped at 1.2 -> -1.2
    # token 2: masked out
    prox = torch.tensor([-1.0, -1.0, -1.0])
    beh = torch.tensor([-2.0, -1.0, -9.0])
    lp = (prox + torch.tensor([1.1, 1.5, 7.0]).log()).requires_grad_(True)
    adv = torch.tensor([1.0, 1.0, 5.0])
    mask = torch.tensor([1.0, 1.0, 0.0])
    loss, stats = decoupled_ppo_loss(lp, prox, beh, adv, mask, 0.2, behav_weight_cap=2.0)
    assert loss.item() == pytest.approx((-2.2 - 1.2) / 2, abs=1e-6)
    assert stats["behav_capped_frac"] == 0.5 and stats["behav_weight_max"] == pytest.approx(2.0)
    assert stats["behav_weight_mean"] == pytest.approx(1.5)
    assert stats["clip_frac"] == 0.5 and stats["ratio_max"] == pytest.approx(1.5, abs=1e-6)
    loss.backward()
    torch.testing.assert_close(lp.grad, torch.tensor([-2.0 * 1.1 / 2, 0.0, 0.0]))
    uncapped, st = decoupled_ppo_loss(lp.detach(), prox, beh, adv, mask, 0.2)
    assert uncapped.item() == pytest.approx((-1.1 * math.e - 1.2) / 2, abs=1e-5) and st["behav_capped_frac"] == 0.0


def test_decoupled_ppo_with_proximal_equal_behaviour_is_grpo():
    g = torch.Generator().manual_seed(3)
    beh = -torch.rand(9, generator=g) * 3
    lp = beh + torch.randn(9, generator=g) * 0.3
    adv = torch.randn(9, generator=g)
    mask = (torch.rand(9, generator=g) > 0.2).float()
    a, _ = decoupled_ppo_loss(lp, beh, beh, adv, mask, 0.2, dual_clip=3.0)
    b, _ = grpo_loss(lp, beh, adv, mask, 0.2, dual_clip=3.0)
    assert a.item() == pytest.approx(b.item(), abs=1e-6)


def test_kl_estimators_hand_computed():
    lp = torch.tensor([-1.0, -2.0], requires_grad=True)
    ref = torch.tensor([-2.0, -2.0])
    # log(q/p) = -1 and 0: k1 = 1, 0; k3 = e^-1 + 1 - 1 = 0.3679, 0
    torch.testing.assert_close(kl_estimate(lp, ref, "k1"), torch.tensor([1.0, 0.0]))
    k3 = kl_estimate(lp, ref, "k3")
    torch.testing.assert_close(k3, torch.tensor([math.exp(-1), 0.0]))
    k3.sum().backward()  # d/dlp (e^(q-p) - (q-p) - 1) = 1 - e^(q-p)
    torch.testing.assert_close(lp.grad, torch.tensor([1 - math.exp(-1), 0.0]))
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_estimate(lp, ref, "k2")


@pytest.mark.parametrize("chunk_elems", [1, 50, 10**9])
def test_head_logprobs_match_full_logits_and_autograd(chunk_elems):
    g = torch.Generator().manual_seed(4)
    hidden = torch.randn(13, 8, generator=g, dtype=torch.float64)
    weight = torch.randn(29, 8, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 29, (13,), generator=g)
    coef = torch.randn(13, generator=g, dtype=torch.float64)
    h1, w1 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    lp, ent = head_logprobs(h1, w1, targets, 0.7, chunk_elems=chunk_elems)
    (lp.double() * coef).sum().backward()
    h2, w2 = hidden.clone().requires_grad_(True), weight.clone().requires_grad_(True)
    logits = h2 @ w2.T
    (_direct(logits, targets, 0.7) * coef).sum().backward()
    torch.testing.assert_close(lp.double(), _direct(logits.detach(), targets, 0.7), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(ent, token_entropy(logits.detach(), 0.7), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(h1.grad, h2.grad, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(w1.grad, w2.grad, atol=1e-6, rtol=1e-5)
    assert not ent.requires_grad
