"""Packing trajectories into micro-batches and scoring them with a memory-flat lm head.

    Trajectory rows ──pack_rows──► MicroBatch (1, L) packed, position ids restart per row
        ──PolicyScorer (backbone + chunked head)──► per-token logprobs, entropies  (N,)

Invariants:
- Rows are concatenated into one (1, L) sequence without padding; ``position_ids`` restart at 0
  for each row and no ``attention_mask`` is passed, so transformers builds a block-diagonal causal
  mask from the position ids: attention never crosses rows (tests check packed == padded).
- The hidden state at position t-1 scores token t; only tokens with ``loss_mask`` 1 are scored.
  Per-token fields of a MicroBatch (targets, behaviour, advantages, versions) cover exactly the
  scored positions, in row order.
- Rows are packed greedily in order; a micro-batch holds at most ``micro_batch_tokens`` tokens
  unless a single row is longer (it then gets a micro-batch of its own). Rows without a single
  trained token are skipped.
- ``PolicyScorer`` never builds (tokens, vocab) logits: the lm head is applied in chunks inside
  ``areal.trainer.loss.head_logprobs``. It is an ``nn.Module`` so that DDP can wrap it (DDP only
  all-reduces gradients of forwards that go through its own ``__call__``).
- Varlen attention (``PolicyScorer(varlen=True)``, ``trainer.varlen_attention``, the default):
  the scorer switches the model to the attention registered as ``PACKED_ATTENTION``, which runs
  causal SDPA row by row (the row bounds come from the position-id restarts) instead of one
  masked SDPA over the whole micro-batch. A masked SDPA computes all L x L scores of the
  micro-batch (the block-diagonal mask only discards the cross-row ones); row by row it is the
  sum of the squares of the rows' lengths, with no mask to apply. Without the row bounds (a plain
  ``model(...)`` call) that attention is transformers' SDPA, unchanged.

Not covered: models whose head is more than a bias-free linear layer (logit soft-capping,
scaled logits): ``PolicyScorer`` refuses a config with ``final_logit_softcapping`` set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

from areal.kernels import use_onednn_linears
from areal.protocol import Trajectory
from areal.trainer.loss import DEFAULT_CHUNK_ELEMS, head_logprobs

PACKED_ATTENTION = "areal_packed"  # the attention implementation PolicyScorer(varlen=True) selects


@dataclass
class MicroBatch:
    """Rows packed into one sequence; per-token fields cover the scored positions only."""

    input_ids: torch.Tensor  # (1, L) long
    position_ids: torch.Tensor  # (1, L) long, restarting at 0 per row
    pred_pos: torch.Tensor  # (N,) positions whose hidden state scores the next token
    targets: torch.Tensor  # (N,) the scored tokens
    behaviour: torch.Tensor  # (N,) engine logprobs of the targets
    advantages: torch.Tensor  # (N,)
    versions: torch.Tensor  # (N,) policy version that sampled each target
    row_index: torch.Tensor  # (N,) the row (0..rows-1 in this micro-batch) each target belongs to
    rows: int = 0
    proximal: torch.Tensor | None = None  # (N,) logprobs under the step's initial weights (decoupled PPO)
    reference: torch.Tensor | None = None  # (N,) logprobs under the reference model (KL)


def pack_rows(
    trajs: list[Trajectory],
    advantages: torch.Tensor | list[torch.Tensor],
    micro_batch_tokens: int,
) -> list[MicroBatch]:
    """Greedily pack every row with at least one trained token into micro-batches, in order.

    advantages: (len(trajs),) one per episode (every row shares it), or one (rows,) tensor per
    episode (per-row advantages, e.g. from discounted per-turn returns).
    """
    if len(advantages) != len(trajs):
        raise ValueError(f"{len(advantages)} advantages for {len(trajs)} trajectories")
    parts: list[list[tuple]] = [[]]
    used = 0
    for traj, adv in zip(trajs, advantages):
        rows = traj.rows()
        per_row = adv.tolist() if adv.ndim == 1 else [float(adv)] * len(rows)
        if len(per_row) != len(rows):
            raise ValueError(f"episode {traj.episode_id}: {len(per_row)} advantages for {len(rows)} rows")
        for row, a in zip(rows, per_row):
            n = len(row.input_ids)
            if not row.loss_mask.any():
                continue  # nothing to train (e.g. a failed episode's prompt-only row)
            if row.loss_mask[0]:
                raise ValueError(f"episode {traj.episode_id}: a row starts with a sampled token (no prompt)")
            if used and used + n > micro_batch_tokens:
                parts.append([])
                used = 0
            parts[-1].append((row, a))
            used += n
    return [_build_micro_batch(p) for p in parts if p]


def _build_micro_batch(rows: list[tuple]) -> MicroBatch:
    ids, pos, pred, tgt, beh, adv, ver, idx = [], [], [], [], [], [], [], []
    offset = 0
    for i, (row, a) in enumerate(rows):
        n = len(row.input_ids)
        ids.append(row.input_ids)
        pos.append(np.arange(n))
        scored = np.nonzero(row.loss_mask[1:])[0] + 1  # token t is scored by the state at t-1
        pred.append(offset + scored - 1)
        tgt.append(row.input_ids[scored])
        beh.append(row.logprobs[scored])
        ver.append(row.versions[scored])
        adv.append(np.full(len(scored), a, dtype=np.float32))
        idx.append(np.full(len(scored), i))
        offset += n

    def cat(xs: list[np.ndarray], dtype: torch.dtype) -> torch.Tensor:
        return torch.from_numpy(np.concatenate(xs).astype(np.int64 if dtype == torch.long else np.float32))

    return MicroBatch(
        input_ids=cat(ids, torch.long)[None],
        position_ids=cat(pos, torch.long)[None],
        pred_pos=cat(pred, torch.long),
        targets=cat(tgt, torch.long),
        behaviour=cat(beh, torch.float32),
        advantages=cat(adv, torch.float32),
        versions=cat(ver, torch.long),
        row_index=cat(idx, torch.long),
        rows=len(rows),
    )


def micro_batch_logits(model: torch.nn.Module, mb: MicroBatch) -> torch.Tensor:
    """Full logits at the scored positions, (N, V): for tests and metrics on small vocabularies.
    use_cache=False keeps the packed-sequence mask."""
    out = model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False, logits_to_keep=mb.pred_pos)
    return out.logits[0]


def packed_attention_forward(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    packed_row_bounds: list[int] | None = None,
    **kwargs,
) -> tuple[torch.Tensor, None]:
    """Causal attention within each packed row: query (1, heads, L, D), key/value (1, kv_heads, L, D);
    ``packed_row_bounds`` the row offsets [0, ..., L]. Returns (1, L, heads, D) as transformers'
    attention functions do. Without bounds it is transformers' SDPA with its mask."""
    if packed_row_bounds is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    if query.shape[0] != 1 or packed_row_bounds[-1] != query.shape[2]:
        raise ValueError(f"packed attention: rows {packed_row_bounds[-1]} tokens, query {tuple(query.shape)} (one packed sequence)")
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)  # (1, heads, L, D)
    parts = [
        torch.nn.functional.scaled_dot_product_attention(
            query[:, :, s:e], key[:, :, s:e], value[:, :, s:e], dropout_p=dropout, scale=scaling, is_causal=True
        )
        for s, e in zip(packed_row_bounds[:-1], packed_row_bounds[1:])
    ]
    return torch.cat(parts, dim=2).transpose(1, 2).contiguous(), None


AttentionInterface.register(PACKED_ATTENTION, packed_attention_forward)
ALL_MASK_ATTENTION_FUNCTIONS.register(PACKED_ATTENTION, sdpa_mask)  # the mask a plain call gets, as under sdpa


def row_bounds(position_ids: torch.Tensor) -> list[int]:
    """Row offsets [0, ..., L] of a packed (1, L) sequence whose positions restart at 0 per row."""
    starts = torch.nonzero(position_ids[0] == 0).flatten().tolist()
    return starts + [position_ids.shape[1]]


class PolicyScorer(torch.nn.Module):
    """Wraps an HF causal LM: ``forward(mb)`` -> (logprobs, entropies) of ``mb.targets``, (N,) each.

    The backbone (``model.base_model``) yields the final hidden states; the lm head is applied
    chunk by chunk by ``head_logprobs``, so memory is flat in the vocabulary size. ``varlen``
    switches the model's attention to ``PACKED_ATTENTION`` (row by row; see the module docstring)
    when it is SDPA; other implementations (flash attention's own varlen path, eager) are kept.
    """

    def __init__(self, model: torch.nn.Module, temperature: float, chunk_elems: int = DEFAULT_CHUNK_ELEMS, varlen: bool = True) -> None:
        super().__init__()
        if getattr(model.config, "final_logit_softcapping", None):
            raise ValueError("PolicyScorer: models with final_logit_softcapping are not supported")
        head = model.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            raise ValueError("PolicyScorer: the lm head must be a bias-free linear layer")
        self.varlen = varlen and model.config._attn_implementation in ("sdpa", PACKED_ATTENTION)
        if self.varlen:
            model.set_attn_implementation(PACKED_ATTENTION)
        self.onednn_linears = use_onednn_linears(model)  # fp32 on the CPU: areal/kernels.py
        self.model = model
        self.temperature = temperature
        self.chunk_elems = chunk_elems

    def forward(self, mb: MicroBatch) -> tuple[torch.Tensor, torch.Tensor]:
        extra = {"packed_row_bounds": row_bounds(mb.position_ids)} if self.varlen else {}
        out = self.model.base_model(input_ids=mb.input_ids, position_ids=mb.position_ids, use_cache=False, **extra)
        hidden = out.last_hidden_state[0, mb.pred_pos.to(out.last_hidden_state.device)]  # (N, H)
        weight = self.model.get_output_embeddings().weight  # (V, H)
        return head_logprobs(hidden, weight, mb.targets.to(hidden.device), self.temperature, self.chunk_elems)
