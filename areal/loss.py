"""GRPO advantages, token logprobs and the clipped policy loss, as pure tensor functions.

Everything here is free of I/O, of models and of process state, so each function is unit-tested
against hand-computed values (tests/test_loss.py). The trainer (areal/trainer.py) composes them.

Invariants:
- Advantages are normalised per group (all samples of one prompt) with the population standard
  deviation; a group whose rewards are all equal gets advantage 0 for every member (no signal,
  no noise), and a group of one gets 0 as well.
- ``token_logprobs`` never materialises a (tokens, vocab) tensor beyond one chunk of rows besides
  the logits themselves: the forward keeps only the per-token log-sum-exp, the backward recomputes
  the softmax chunk by chunk. Peak extra memory is ``chunk_tokens * vocab`` floats whatever the
  number of tokens.
- Loss functions return ``(loss, stats)``: ``loss`` is a scalar averaged over masked tokens,
  ``stats`` holds detached Python floats, including ``tokens`` (the masked-token count) so that
  callers can combine micro-batches with token weights. One algorithm per function; PPO variants
  get their own functions next to ``grpo_loss``.
"""

from __future__ import annotations

import torch

DEFAULT_CHUNK_TOKENS = 1024


def group_advantages(rewards: torch.Tensor, group_ids: list[str], eps: float = 1e-6) -> torch.Tensor:
    """GRPO advantages: ``(r - mean_group) / (std_group + eps)``, std over the population.

    rewards: (N,) one reward per trajectory; group_ids: N group names. Returns (N,) float32.
    """
    if rewards.ndim != 1 or rewards.shape[0] != len(group_ids):
        raise ValueError(f"rewards shape {tuple(rewards.shape)} does not match {len(group_ids)} group_ids")
    rewards = rewards.to(torch.float32)
    index: dict[str, int] = {}
    gid = torch.tensor([index.setdefault(g, len(index)) for g in group_ids], dtype=torch.long)
    n_groups = len(index)
    counts = torch.zeros(n_groups).index_add_(0, gid, torch.ones_like(rewards))
    mean = torch.zeros(n_groups).index_add_(0, gid, rewards) / counts
    centred = rewards - mean[gid]
    var = torch.zeros(n_groups).index_add_(0, gid, centred * centred) / counts
    std = var.sqrt()
    # The float mean of identical rewards need not equal them exactly (3 * 0.1 / 3 != 0.1), and
    # round-off divided by eps would be noise of order 1e-2: force constant groups to exactly 0.
    hi = torch.full((n_groups,), -torch.inf).scatter_reduce_(0, gid, rewards, "amax")
    lo = torch.full((n_groups,), torch.inf).scatter_reduce_(0, gid, rewards, "amin")
    centred = torch.where((hi == lo)[gid], torch.zeros_like(centred), centred)
    return centred / (std[gid] + eps)


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


def grpo_loss(
    logprobs: torch.Tensor,
    behaviour_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    clip_eps: float,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped surrogate with the engine's behaviour logprobs as the old policy.

    All inputs (N,) per token. Per token ``-min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)``
    with ``ratio = exp(logprobs - behaviour_logprobs)``, averaged over tokens where loss_mask is
    nonzero. stats: tokens, clip_frac (share of masked tokens where the clipped term is active and
    so carries no gradient), ratio_mean, ratio_max, ratio_min, approx_kl (mean of
    behaviour - current logprob), adv_mean.
    """
    mask = loss_mask.to(torch.float32)
    n = mask.sum()
    denom = n.clamp(min=1.0)  # an all-masked batch gives loss 0, not NaN
    ratio = torch.exp(logprobs - behaviour_logprobs)
    unclipped = ratio * advantages
    clipped = torch.clamp(ratio, 1.0 - clip_eps, 1.0 + clip_eps) * advantages
    per_token = -torch.minimum(unclipped, clipped)
    loss = (per_token * mask).sum() / denom

    with torch.no_grad():
        on = mask > 0
        r = ratio.detach()
        stats = {
            "tokens": float(n),
            "clip_frac": float(((clipped < unclipped) & on).float().sum() / denom),
            "ratio_mean": float((r * mask).sum() / denom),
            "ratio_max": float(r[on].max()) if bool(on.any()) else 1.0,
            "ratio_min": float(r[on].min()) if bool(on.any()) else 1.0,
            "approx_kl": float(((behaviour_logprobs - logprobs.detach()) * mask).sum() / denom),
            "adv_mean": float((advantages * mask).sum() / denom),
        }
    return loss, stats
