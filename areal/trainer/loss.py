"""Advantages, token logprobs, policy losses and KL estimates, as pure tensor functions.

Everything here is free of I/O, of models and of process state, so each function is unit-tested
against hand-computed values (tests/unit/trainer/test_loss.py). The trainer (areal/trainer/rank.py) composes them
and picks one policy loss once from its config (``grpo_loss`` or ``decoupled_ppo_loss``).

Invariants:
- Advantages are normalised per group (all samples of one prompt) with the population standard
  deviation; a group whose returns are all equal gets advantage 0 for every member (no signal,
  no noise), and a group of one gets 0 as well. In ``episode_advantages`` every episode weighs
  the same in its group's mean and std whatever its number of rows (turns), and all rows of an
  episode are normalised with their group's statistics.
- Per-turn returns (``turn_returns``) discount later rewards by ``gamma`` per row, in row order:
  a chain's return-to-go. The trainer's returns follow the conversation tree instead, and its
  per-turn baselines are credit.py's (``trainer.credit``), which says why.
- Advantage statistics are computed in float64 and returned as float32: a group's variance
  squares its rewards, which overflows float32 from rewards of about 1.8e19 on (NaN advantages).
- ``token_logprobs`` / ``head_logprobs`` never materialise a (tokens, vocab) tensor beyond one
  chunk: the forward keeps only the per-token log-sum-exp, the backward recomputes the softmax
  chunk by chunk (``head_logprobs`` also recomputes the lm head, so not even the logits exist).
- Loss functions return ``(loss, stats)``: ``loss`` is a scalar averaged over masked tokens,
  ``stats`` holds detached Python floats, including ``tokens`` (the masked-token count) so that
  callers can combine micro-batches and ranks with token weights. One algorithm per function.

Not covered: a learned critic (GAE); PPO here is the decoupled clipped objective on
group-normalised returns, as in AReaL's GRPO/PPO actors.
"""

from __future__ import annotations

import torch

from areal.trainer.config import CORRECTIONS, LOSS_AGGS

DEFAULT_CHUNK_TOKENS = 1024
DEFAULT_CHUNK_ELEMS = 1 << 24  # (rows x vocab) floats per head chunk: 64 MiB in fp32


def group_advantages(rewards: torch.Tensor, group_ids: list[str], eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages: ``(r - mean_group) / (std_group + eps)``, std over the population.

    rewards: (N,) one reward per trajectory; group_ids: N group names. Returns (N,) float32
    (computed in float64).
    """
    if rewards.ndim != 1 or rewards.shape[0] != len(group_ids):
        raise ValueError(f"rewards shape {tuple(rewards.shape)} does not match {len(group_ids)} group_ids")
    rewards = rewards.to(torch.float64)
    index: dict[str, int] = {}
    gid = torch.tensor([index.setdefault(g, len(index)) for g in group_ids], dtype=torch.long)
    n_groups = len(index)
    counts = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, gid, torch.ones_like(rewards))
    mean = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, gid, rewards) / counts
    centred = rewards - mean[gid]
    var = torch.zeros(n_groups, dtype=torch.float64).index_add_(0, gid, centred * centred) / counts
    std = var.sqrt()
    # The float mean of identical rewards need not equal them exactly (3 * 0.1 / 3 != 0.1), and
    # round-off divided by eps would be noise of order 1e-2: force constant groups to exactly 0.
    hi = torch.full((n_groups,), -torch.inf, dtype=torch.float64).scatter_reduce_(0, gid, rewards, "amax")
    lo = torch.full((n_groups,), torch.inf, dtype=torch.float64).scatter_reduce_(0, gid, rewards, "amin")
    centred = torch.where((hi == lo)[gid], torch.zeros_like(centred), centred)
    return (centred / (std[gid] + eps)).to(torch.float32)


def turn_returns(row_rewards: torch.Tensor, gamma: float, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Discounted return of each row (turn): ``G_k = sum_{j >= k} gamma^(j - k) r_j``.

    row_rewards: (K,) rewards of one episode's rows in order. Returns (K,) of ``dtype``.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma}")
    out = torch.empty(row_rewards.shape[0], dtype=dtype)
    acc = 0.0
    for k in range(row_rewards.shape[0] - 1, -1, -1):
        acc = float(row_rewards[k]) + gamma * acc
        out[k] = acc
    return out


def episode_advantages(returns: list[torch.Tensor], group_ids: list[str], eps: float = 1e-6) -> list[torch.Tensor]:
    """Per-row advantages ``(G - mean_group) / (std_group + eps)`` for multi-row episodes.

    returns: one (K_i,) tensor of row returns per episode; group_ids: one group per episode. The
    group's mean and population std weigh each row 1 / K_i, so every episode counts once however
    many turns it has; with one return per episode this is exactly ``group_advantages``.
    Returns float32 tensors, computed in float64.
    """
    if len(returns) != len(group_ids):
        raise ValueError(f"{len(returns)} episodes but {len(group_ids)} group_ids")
    if any(r.ndim != 1 or r.shape[0] == 0 for r in returns):
        raise ValueError("every episode needs a non-empty (K,) tensor of row returns")
    index: dict[str, int] = {}
    gid = torch.tensor([index.setdefault(g, len(index)) for g in group_ids], dtype=torch.long)
    f64 = torch.float64
    rows = torch.cat([r.to(f64) for r in returns])  # (R,)
    sizes = torch.tensor([r.shape[0] for r in returns])
    row_gid = gid.repeat_interleave(sizes)
    w = (1.0 / sizes.to(f64)).repeat_interleave(sizes)  # each episode weighs 1
    n_groups = len(index)
    wsum = torch.zeros(n_groups, dtype=f64).index_add_(0, row_gid, w)
    mean = torch.zeros(n_groups, dtype=f64).index_add_(0, row_gid, w * rows) / wsum
    centred = rows - mean[row_gid]
    std = (torch.zeros(n_groups, dtype=f64).index_add_(0, row_gid, w * centred * centred) / wsum).sqrt()
    # As in group_advantages: constant groups are exactly 0, not round-off divided by eps.
    hi = torch.full((n_groups,), -torch.inf, dtype=f64).scatter_reduce_(0, row_gid, rows, "amax")
    lo = torch.full((n_groups,), torch.inf, dtype=f64).scatter_reduce_(0, row_gid, rows, "amin")
    const = (hi == lo)[row_gid]
    adv = torch.where(const, torch.zeros_like(centred), centred / torch.where(const, 1.0, std[row_gid] + eps))
    return list(torch.split(adv.to(torch.float32), sizes.tolist()))


class _ChunkedTokenLogprob(torch.autograd.Function):
    """log_softmax(logits / T)[i, targets[i]] with a chunked, recomputing backward.

    d logp_i / d logits_ij = (onehot_ij - softmax_ij) / T, so the backward needs only the
    log-sum-exp per row saved from the forward.
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, targets: torch.Tensor, temperature: float, chunk: int) -> torch.Tensor:
        n = logits.shape[0]
        out = torch.empty(n, dtype=torch.float32, device=logits.device)
        lse = torch.empty(n, dtype=torch.float32, device=logits.device)
        for s in range(0, n, chunk):
            block = logits[s : s + chunk].float() / temperature  # (C, V)
            lse[s : s + chunk] = torch.logsumexp(block, dim=-1)
            out[s : s + chunk] = block.gather(-1, targets[s : s + chunk, None]).squeeze(-1) - lse[s : s + chunk]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor | None, None, None, None]:
        logits, targets, lse = ctx.saved_tensors
        t, chunk = ctx.temperature, ctx.chunk
        grad = torch.empty_like(logits)
        for s in range(0, logits.shape[0], chunk):
            block = logits[s : s + chunk].float() / t  # (C, V)
            g = grad_out[s : s + chunk, None].float()
            probs = torch.exp(block - lse[s : s + chunk, None])
            gblock = -g * probs
            gblock.scatter_add_(-1, targets[s : s + chunk, None], g)
            grad[s : s + chunk] = (gblock / t).to(logits.dtype)
        return grad, None, None, None


def token_logprobs(
    logits: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> torch.Tensor:
    """Logprob of each target under ``softmax(logits / temperature)``, differentiable.

    logits: (N, V); targets: (N,) int. Returns (N,) float32. Computed ``chunk_tokens`` rows at a
    time, forward and backward, so memory stays flat in the vocabulary size.
    """
    if logits.ndim != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"logits {tuple(logits.shape)} and targets {tuple(targets.shape)} must be (N, V), (N,)")
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    return _ChunkedTokenLogprob.apply(logits, targets.long(), float(temperature), int(chunk_tokens))


@torch.no_grad()
def token_entropy(logits: torch.Tensor, temperature: float, chunk_tokens: int = DEFAULT_CHUNK_TOKENS) -> torch.Tensor:
    """Entropy of ``softmax(logits / temperature)`` per row, for metrics only (no gradient).

    logits: (N, V). Returns (N,) float32.
    """
    out = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
    for s in range(0, logits.shape[0], chunk_tokens):
        logp = torch.log_softmax(logits[s : s + chunk_tokens].float() / temperature, dim=-1)  # (C, V)
        out[s : s + chunk_tokens] = -(logp.exp() * logp).sum(-1)
    return out


def _head_block(out: torch.Tensor, h: torch.Tensor, weight: torch.Tensor, temperature: float) -> torch.Tensor:
    """``out[:] = (h @ weight.T) / temperature`` in float32, written into the reused block ``out``."""
    if h.dtype == torch.float32 and weight.dtype == torch.float32:
        torch.mm(h, weight.T, out=out)
    else:  # low-precision head: the product is rounded as the model would, then widened
        out.copy_(h @ weight.T)
    if temperature != 1.0:
        out.div_(temperature)
    return out


class _ChunkedHeadLogprob(torch.autograd.Function):
    """log_softmax((hidden @ weight.T) / T)[i, targets[i]] without ever holding (N, V) logits.

    The lm head runs ``chunk`` rows at a time in the forward (keeping only the log-sum-exp and
    the entropy per row) and again in the backward, where ``G = g * (onehot - softmax) / T`` of
    one chunk gives ``dH = G @ W`` and ``dW += G.T @ H``. Peak extra memory: two (chunk, V)
    float32 blocks in the forward, one in the backward, allocated once per call and reused for
    every chunk in place: a fresh 64 MiB block per chunk would be a fresh mmap whose page faults
    cost as much CPU time as the arithmetic.
    """

    @staticmethod
    def forward(
        ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, temperature: float, chunk: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n, dev = hidden.shape[0], hidden.device
        out = torch.empty(n, dtype=torch.float32, device=dev)
        lse = torch.empty(n, dtype=torch.float32, device=dev)
        ent = torch.empty(n, dtype=torch.float32, device=dev)
        block = torch.empty(min(chunk, n), weight.shape[0], dtype=torch.float32, device=dev)  # (C, V)
        expd = torch.empty_like(block)
        for s in range(0, n, chunk):
            c = min(chunk, n - s)
            z = _head_block(block[:c], hidden[s : s + c], weight, temperature)  # logits / T
            top = z.amax(dim=-1)
            z.sub_(top[:, None])  # z - max: exp cannot overflow
            e = torch.exp(z, out=expd[:c])
            total = e.sum(-1)
            log_total = total.log()
            lse[s : s + c] = top + log_total
            # logp_t = (z_t - max) - log sum exp(z - max); H = log sum - sum(e * (z - max)) / sum
            out[s : s + c] = z.gather(-1, targets[s : s + c, None]).squeeze(-1) - log_total
            ent[s : s + c] = log_total - e.mul_(z).sum(-1) / total
        ctx.save_for_backward(hidden, weight, targets, lse)
        ctx.temperature, ctx.chunk = temperature, chunk
        ctx.mark_non_differentiable(ent)
        return out, ent

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor, _grad_ent: torch.Tensor) -> tuple:
        hidden, weight, targets, lse = ctx.saved_tensors
        t, chunk, n = ctx.temperature, ctx.chunk, hidden.shape[0]
        grad_h = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
        grad_w = torch.zeros_like(weight, dtype=torch.float32) if ctx.needs_input_grad[1] else None
        block = torch.empty(min(chunk, n), weight.shape[0], dtype=torch.float32, device=hidden.device)  # (C, V)
        for s in range(0, n, chunk):
            c = min(chunk, n - s)
            h = hidden[s : s + c]
            g = grad_out[s : s + c, None].float()
            gz = _head_block(block[:c], h, weight, t)
            gz.sub_(lse[s : s + c, None]).exp_().mul_(-g)  # -g * softmax
            gz.scatter_add_(-1, targets[s : s + c, None], g)  # + g at the target
            if t != 1.0:
                gz.div_(t)  # d/dlogits = d/dz / T
            if grad_h is not None:
                grad_h[s : s + c] = (gz.to(weight.dtype) @ weight).to(hidden.dtype)
            if grad_w is not None:
                grad_w.addmm_(gz.T, h.float())  # in place: no (V, H) temporary per chunk
        return grad_h, None if grad_w is None else grad_w.to(weight.dtype), None, None, None


def head_logprobs(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    targets: torch.Tensor,
    temperature: float,
    chunk_elems: int = DEFAULT_CHUNK_ELEMS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprobs (differentiable) and entropies (detached) of ``targets`` under the lm head.

    hidden: (N, H) final hidden states at the scoring positions; weight: (V, H) the lm head (no
    bias); targets: (N,). Returns two (N,) float32 tensors. Rows are processed in chunks of
    ``chunk_elems // V`` so that memory stays flat in the vocabulary size.
    """
    if hidden.ndim != 2 or weight.ndim != 2 or hidden.shape[1] != weight.shape[1] or targets.shape != hidden.shape[:1]:
        raise ValueError(
            f"hidden {tuple(hidden.shape)}, weight {tuple(weight.shape)}, targets {tuple(targets.shape)} must be (N, H), (V, H), (N,)"
        )
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    chunk = max(1, int(chunk_elems) // weight.shape[0])
    return _ChunkedHeadLogprob.apply(hidden, weight, targets.long(), float(temperature), chunk)


def _row_sums(values: torch.Tensor, row_index: torch.Tensor) -> torch.Tensor:
    """(rows,) the sum of ``values`` (N,) over each row's tokens; ``row_index`` (N,) names each
    token's row, 0..rows-1 (every row has a token, so no sum is empty)."""
    rows = int(row_index.max()) + 1 if row_index.numel() else 0
    return torch.zeros(rows, dtype=values.dtype, device=values.device).index_add_(0, row_index, values)


def rollout_correction(
    proximal: torch.Tensor, behaviour: torch.Tensor, row_index: torch.Tensor, mode: str, cap: float, floor: float = 0.0
) -> tuple[torch.Tensor, dict[str, float]]:
    """Importance weights that correct for tokens sampled by another policy than the one trained
    (the engine's precision, kernels or older weights: ``behaviour``), one per token, no gradient.

    With ``rho = exp(proximal - behaviour)`` per token (``proximal``: the trainer's logprob under
    the weights the step starts from), as verl's rollout correction and TRL's define them:

    - ``token_tis``: truncated IS per token, ``min(rho, cap)`` (Ionides 2008; "Your efficient RL
      framework secretly brings you off-policy RL training", Yao et al. 2025);
    - ``seq_tis``: one weight per row, the product of its tokens' ratios, truncated at ``cap``;
    - ``token_mis``: masked IS per token, ``rho`` where ``floor <= rho <= cap``, else 0 (the token
      is rejected: it adds nothing to the loss);
    - ``seq_mis``: the row's product, the whole row rejected outside ``[floor, cap]``.

    ``row_index`` (N,) says which row each token belongs to (a row's tokens are one sample of the
    sequence). Untruncated (``cap`` = inf) the weights make the gradient an unbiased estimate under
    the trained policy; truncation trades a bounded bias for bounded variance. Returns the weights
    (N,) and the mismatch statistics peers log: the log-ratio's mean and largest magnitude, the
    k3 estimate of KL(behaviour || trainer), the mean weight, and the share of tokens truncated or
    rejected (``rc_``-prefixed, averaged over the tokens).
    """
    if mode not in CORRECTIONS or mode == "none":
        raise ValueError(f"rollout correction mode must be one of {CORRECTIONS[1:]}, got {mode!r}")
    log_ratio = (proximal - behaviour).detach()
    log_ratio = log_ratio.to(torch.promote_types(log_ratio.dtype, torch.float32))  # bf16 logprobs: in fp32
    if mode.startswith("seq"):
        rho = _row_sums(log_ratio, row_index).exp()[row_index]
    else:
        rho = log_ratio.exp()
    if mode.endswith("tis"):
        affected = rho > cap
        weight = rho.clamp(max=cap)
    else:
        affected = (rho > cap) | (rho < floor)
        weight = torch.where(affected, torch.zeros_like(rho), rho)
    n = max(log_ratio.numel(), 1)
    stats = {
        "rc_log_ratio_mean": float(log_ratio.sum()) / n,
        "rc_log_ratio_absmax": float(log_ratio.abs().max()) if log_ratio.numel() else 0.0,
        "rc_kl": float((log_ratio.exp() - 1.0 - log_ratio).sum()) / n,
        "rc_weight_mean": float(weight.sum()) / n,
        "rc_affected_frac": float(affected.float().sum()) / n,
    }
    return weight, stats


def sequence_ratio_logprobs(logprobs: torch.Tensor, old_logprobs: torch.Tensor, row_index: torch.Tensor) -> torch.Tensor:
    """GSPO's sequence-level ratio (Zheng et al. 2025, "Group Sequence Policy Optimization"), in
    its token form: logprobs whose ratio to ``old_logprobs`` is, at every token of a row, the row's
    geometric-mean ratio ``s = exp(mean_t(logprobs - old))``, and whose gradient is
    ``s * grad logprobs`` at each token. Fed to a clipped loss in place of ``logprobs``, the clip
    acts on ``s``, once per row. ``row_index`` (N,): each token's row."""
    log_ratio = (logprobs - old_logprobs).detach()
    seq_log_ratio = (_row_sums(log_ratio, row_index) / _row_sums(torch.ones_like(log_ratio), row_index))[row_index]
    return logprobs - logprobs.detach() + old_logprobs.detach() + seq_log_ratio


def aggregation_scale(row_index: torch.Tensor, mode: str, total_tokens: float, total_rows: float, norm_tokens: int = 0) -> torch.Tensor:
    """Per-token factors that turn the trainer's token mean over the update's ``total_tokens`` into
    another aggregation of the per-token losses ``l_t`` (every surrogate here is positively
    homogeneous in the advantage, so the factor multiplies the advantages):

    - ``token_mean``: ``sum_t l_t / total_tokens`` (every token weighs the same; DAPO, Yu et al. 2025);
    - ``seq_mean_token_mean``: ``mean over rows of (mean over the row's tokens)`` (GRPO as Shao et
      al. 2024 write it: a long row weighs as much as a short one);
    - ``seq_mean_token_sum_norm``: ``sum_t l_t / (total_rows * norm_tokens)`` (Dr. GRPO, Liu et al.
      2025: a constant normaliser, no length bias).

    ``row_index`` (N,): each token's row in its micro-batch. Returns (N,) float32.
    """
    if mode not in LOSS_AGGS:
        raise ValueError(f"loss aggregation must be one of {LOSS_AGGS}, got {mode!r}")
    ones = torch.ones(row_index.shape[0], dtype=torch.float32, device=row_index.device)
    if mode == "token_mean":
        return ones
    if mode == "seq_mean_token_sum_norm":
        return ones * (total_tokens / (total_rows * norm_tokens))
    return total_tokens / (_row_sums(ones, row_index)[row_index] * total_rows)


def _clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_eps: float, dual_clip: float | None, clip_eps_high: float | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token ``-min(r A, clip(r, 1 - eps, 1 + eps_high) A)``, bounded by ``-c A`` for A < 0
    when dual clipping. ``clip_eps_high`` (None: ``clip_eps``) is DAPO's clip-higher (Yu et al.
    2025): a wider upper bound lets unlikely tokens with positive advantage grow.

    Returns (per-token loss, bool mask of tokens where a clip is active, i.e. no gradient).
    """
    unclipped = ratio * advantages
    high = clip_eps if clip_eps_high is None else clip_eps_high
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + high) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    clipped_on = clipped < unclipped
    if dual_clip is not None:
        # Dual clip (Ye et al. 2020): with A < 0 a huge ratio would make -rA unbounded; cap it at -cA.
        bound = -dual_clip * advantages
        dual_on = (advantages < 0) & (per_token > bound)
        per_token = torch.where(dual_on, bound, per_token)
        clipped_on = clipped_on | dual_on
    return per_token, clipped_on


def _ratio_stats(
    ratio: torch.Tensor, clipped_on: torch.Tensor, mask: torch.Tensor, denom: torch.Tensor, n: torch.Tensor
) -> dict[str, float]:
    on = mask > 0
    r = ratio.detach()
    return {
        "tokens": float(n),
        "clip_frac": float((clipped_on & on).float().sum() / denom),
        "ratio_mean": float((r * mask).sum() / denom),
        "ratio_max": float(r[on].max()) if bool(on.any()) else 1.0,
        "ratio_min": float(r[on].min()) if bool(on.any()) else 1.0,
    }


def grpo_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float,
    dual_clip: float | None = None,
    clip_eps_high: float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate with the engine's behaviour logprobs as the old policy (coupled).

    All inputs (N,) per token. Per token ``-min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)``
    with ``ratio = exp(logprobs - behaviour_logprobs)``, optionally dual-clipped at ``-c A`` for
    negative advantages, averaged over tokens where loss_mask is nonzero. stats: tokens,
    clip_frac (share of masked tokens where a clip is active and so carries no gradient),
    ratio_mean, ratio_max, ratio_min, approx_kl (mean of behaviour - current logprob), adv_mean.
    """
    mask = loss_mask.to(torch.float32)
    n = mask.sum()
    denom = n.clamp(min=1.0)  # an all-masked batch gives loss 0, not NaN
    ratio = torch.exp(logprobs - behaviour_logprobs)
    per_token, clipped_on = _clipped_surrogate(ratio, advantages, clip_eps, dual_clip, clip_eps_high)
    loss = (per_token * mask).sum() / denom
    with torch.no_grad():
        stats = _ratio_stats(ratio, clipped_on, mask, denom, n)
        stats["approx_kl"] = float(((behaviour_logprobs - logprobs.detach()) * mask).sum() / denom)
        stats["adv_mean"] = float((advantages * mask).sum() / denom)
    return loss, stats


def decoupled_ppo_loss(
    logprobs: torch.Tensor,
    proximal_logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float,
    dual_clip: float | None = None,
    behav_weight_cap: float | None = None,
    clip_eps_high: float | None = None,
    correction: tuple[torch.Tensor, dict[str, float]] | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Decoupled PPO (Hilton et al. 2021; AReaL): clip against the proximal policy, correct for
    the behaviour policy that sampled the tokens with an importance weight.

    Per token ``w * surrogate(exp(logprobs - proximal), A)`` with the behaviour weight
    ``w = exp(proximal - behaviour)`` (no gradient), truncated at ``behav_weight_cap`` when given
    (truncated importance sampling: tokens far off-policy still count, with bounded weight), or
    the weights and statistics of ``rollout_correction`` when ``correction`` gives them.
    The surrogate is the clipped (optionally dual-clipped) one of ``grpo_loss``. Averaged over
    masked tokens. stats: those of ``grpo_loss`` (approx_kl against the proximal policy) plus
    behav_weight_mean, behav_weight_max, behav_capped_frac, and the correction's.
    """
    mask = loss_mask.to(torch.float32)
    n = mask.sum()
    denom = n.clamp(min=1.0)
    proximal = proximal_logprobs.detach()
    ratio = torch.exp(logprobs - proximal)
    per_token, clipped_on = _clipped_surrogate(ratio, advantages, clip_eps, dual_clip, clip_eps_high)
    if correction is not None:
        weight, rc_stats = correction
        capped = torch.zeros_like(weight, dtype=torch.bool)
    else:
        rc_stats = {}
        weight = torch.exp(proximal - behaviour_logprobs.detach())
        capped = torch.zeros_like(weight, dtype=torch.bool)
        if behav_weight_cap is not None:
            capped = weight > behav_weight_cap
            weight = weight.clamp(max=behav_weight_cap)
    loss = (weight * per_token * mask).sum() / denom
    with torch.no_grad():
        on = mask > 0
        stats = _ratio_stats(ratio, clipped_on, mask, denom, n)
        stats["approx_kl"] = float(((proximal - logprobs.detach()) * mask).sum() / denom)
        stats["adv_mean"] = float((advantages * mask).sum() / denom)
        stats["behav_weight_mean"] = float((weight * mask).sum() / denom)
        stats["behav_weight_max"] = float(weight[on].max()) if bool(on.any()) else 1.0
        stats["behav_capped_frac"] = float((capped & on).float().sum() / denom)
        stats.update(rc_stats)
    return loss, stats


def kl_estimate(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, estimator: str) -> torch.Tensor:
    """Per-token estimate of KL(policy || reference) from samples of the policy (Schulman 2020).

    k1 = log p - log q (unbiased, high variance, can be negative); k3 = q/p - log(q/p) - 1 with
    q/p = exp(log q - log p) (unbiased, always >= 0). Differentiable in ``logprobs``.
    """
    delta = ref_logprobs.detach() - logprobs  # log(q / p)
    if estimator == "k1":
        return -delta
    elif estimator == "k3":
        return torch.exp(delta) - delta - 1.0
    else:
        raise ValueError(f"kl_estimator must be 'k1' or 'k3', got {estimator!r}")
