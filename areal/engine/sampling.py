"""Sampling for the embedded engine: SGLang's ``sampling_params`` validated, and one token per row.

Invariants:
- Validation follows SGLang's own (its sampling_params.py): unknown keys are a 400 naming the key;
  valid SGLang keys that the embedded engine does not implement are accepted only at their
  SGLang default value (a no-op), any other value is a 400 naming the key.
- Logprobs are ``log_softmax(logits / temperature)`` over the full vocabulary, i.e. temperature
  scaled and taken *before* top-k/top-p/min-p truncation; for temperature < 1e-6 (greedy) they
  are ``log_softmax(logits)``. The trainer computes the same quantity for its behaviour logprobs.
  Top logprobs come from the same distribution.
- Truncation is SGLang's torch sampler's: top-k by rank, top-p on the untruncated cumulative
  mass, min-p relative to the most likely token; the most likely token always survives.
- Sampling is by inverse CDF: one uniform per token from the request's own ``RowRandom`` (a
  seeded ``torch.Generator`` drawn in blocks), advanced once per token of that request only,
  so a seeded request samples the same tokens whatever shares its batch. One uniform per row
  instead of a Gumbel draw per vocabulary entry keeps sampling cheap at any vocabulary size; the
  CDF is summed in float64 per row, so it does not depend on the batch either. It is searched
  in two levels (``_inverse_cdf``): float64 sums of blocks of ``CDF_BLOCK`` tokens, then the
  cumulative sum inside the one block the uniform falls in, so no (B, V) float64 tensor is built.

- A constrained row (``json_schema``, ``regex``, ``ebnf`` or ``structural_tag``: ``grammar.py``)
  is sampled from its masked logits, so its logprobs are those of the masked, renormalised
  distribution it was sampled from (see ``grammar.py`` for what that means to the trainer).

Covered: max_new_tokens, temperature, top_p, top_k, min_p, stop (strings), stop_token_ids,
ignore_eos, n, sampling_seed, and one constraint (json_schema, regex, ebnf, structural_tag).
Not covered: penalties, logit_bias, min_new_tokens, stop_regex (all 400 unless at their default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

GREEDY_EPS = 1e-6
TOP_K_ALL = 1 << 30
MAX_STOP_STRINGS = 32
CDF_BLOCK = 256  # tokens per block of the two-level inverse CDF
CANDIDATES = 64  # tokens ranked before falling back to a full sort for top-k/top-p/min-p
SUPPORTED_KEYS = {"max_new_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids", "ignore_eos", "sampling_seed", "n"}
CONSTRAINT_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")  # at most one (grammar.py runs it)
SUPPORTED_KEYS |= set(CONSTRAINT_KEYS)
# Valid SGLang sampling keys we do not implement, with the values that make them a no-op.
UNSUPPORTED_DEFAULTS: dict[str, tuple[Any, ...]] = {
    "stop_regex": (None, "", []),
    "frequency_penalty": (0, 0.0),
    "presence_penalty": (0, 0.0),
    "repetition_penalty": (1, 1.0),
    "min_new_tokens": (0,),
    "skip_special_tokens": (True,),
    "spaces_between_special_tokens": (True,),
    "no_stop_trim": (False,),
    "stream_interval": (None,),
    "logit_bias": (None, {}),
    "custom_params": (None, {}),
    "beam_width": (None, 0, 1),
    "watermark": (None, False),
    "choice": (None,),
}


class RequestError(ValueError):
    """A request that violates the protocol; answered with HTTP 400."""


@dataclass(frozen=True)
class SamplingParams:
    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = TOP_K_ALL  # -1 and 2^30 both mean the whole vocabulary
    min_p: float = 0.0
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    ignore_eos: bool = False
    sampling_seed: int | None = None
    n: int = 1
    constraint: tuple[str, str] | None = None  # (key, text): constraint_of


def is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def parse_sampling_params(raw: Any, prompt_len: int, context_len: int) -> SamplingParams:
    """Validate one ``sampling_params`` dict as SGLang does; raises RequestError naming the key."""
    _check_keys(raw)
    max_new = _max_new_tokens(raw.get("max_new_tokens", 128), prompt_len, context_len)
    temperature = raw.get("temperature", 1.0)
    if not _is_number(temperature) or temperature < 0:
        raise RequestError(f"sampling_params.temperature must be >= 0, got {temperature!r}")
    top_p = raw.get("top_p", 1.0)
    if not _is_number(top_p) or not 0 < top_p <= 1:
        raise RequestError(f"sampling_params.top_p must be in (0, 1], got {top_p!r}")
    top_k = raw.get("top_k", TOP_K_ALL)
    if not is_int(top_k) or (top_k < 1 and top_k != -1):
        raise RequestError(f"sampling_params.top_k must be -1 or >= 1, got {top_k!r}")
    min_p = raw.get("min_p", 0.0)
    if not _is_number(min_p) or not 0 <= min_p <= 1:
        raise RequestError(f"sampling_params.min_p must be in [0, 1], got {min_p!r}")
    stop = raw.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop) or len(stop) > MAX_STOP_STRINGS:
        raise RequestError(f"sampling_params.stop must be a string or a list of at most {MAX_STOP_STRINGS} strings")
    stop_ids = raw.get("stop_token_ids") or []
    if not isinstance(stop_ids, list) or not all(is_int(t) for t in stop_ids):
        raise RequestError("sampling_params.stop_token_ids must be a list of ints")
    ignore_eos = raw.get("ignore_eos", False)
    if not isinstance(ignore_eos, bool):
        raise RequestError("sampling_params.ignore_eos must be a bool")
    seed = raw.get("sampling_seed")
    if seed is not None and not is_int(seed):
        raise RequestError("sampling_params.sampling_seed must be an int")
    n = raw.get("n", 1)
    if not is_int(n) or n < 1:
        raise RequestError(f"sampling_params.n must be an int >= 1, got {n!r}")
    return SamplingParams(
        constraint=constraint_of(raw),
        max_new_tokens=max_new,
        temperature=float(temperature),
        top_p=float(top_p),
        top_k=TOP_K_ALL if top_k == -1 else top_k,
        min_p=float(min_p),
        stop=tuple(s for s in stop if s),
        stop_token_ids=frozenset(stop_ids),
        ignore_eos=ignore_eos,
        sampling_seed=seed,
        n=n,
    )


def constraint_of(raw: dict) -> tuple[str, str] | None:
    """``(key, text)`` of the one constraint a ``sampling_params`` dict carries, or None."""
    given = [k for k in CONSTRAINT_KEYS if raw.get(k) is not None]
    if len(given) > 1:
        raise RequestError(f"sampling_params: only one of {', '.join(CONSTRAINT_KEYS)} can be set, got {', '.join(given)}")
    if not given:
        return None
    key = given[0]
    if not isinstance(raw[key], str) or not raw[key]:
        raise RequestError(f"sampling_params.{key} must be a non-empty string")
    return key, raw[key]


def _check_keys(raw: Any) -> None:
    """An object whose keys SGLang knows, each one the embedded engine lacks at its no-op default."""
    if not isinstance(raw, dict):
        raise RequestError("sampling_params must be an object")
    for key, value in raw.items():
        if key in UNSUPPORTED_DEFAULTS:
            if value not in UNSUPPORTED_DEFAULTS[key]:
                raise RequestError(f"sampling_params.{key} is not supported by the embedded engine")
        elif key not in SUPPORTED_KEYS:
            raise RequestError(f"Unknown sampling parameter: {key}")


def _max_new_tokens(max_new: Any, prompt_len: int, context_len: int) -> int:
    """``max_new_tokens`` checked against the room the prompt leaves (null: all of it)."""
    room = context_len - prompt_len
    max_new = room if max_new is None else max_new  # null means "until the context is full"
    if not is_int(max_new) or max_new < 0:
        raise RequestError(f"sampling_params.max_new_tokens must be a non-negative int, got {max_new!r}")
    if max_new > room:  # SGLang's TokenizerManager refuses it (unless --allow-auto-truncate), with this message
        raise RequestError(
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens. You requested a total of "
            f"{prompt_len + max_new} tokens: {prompt_len} tokens from the input messages and {max_new} tokens for the completion. "
            "Please reduce the number of tokens in the input messages or the completion to fit within the limit."
        )
    return max_new


class RowRandom:
    """One request's uniform stream in [0, 1): a seeded generator, drawn ``BLOCK`` at a time
    (one call per block instead of one per token), consumed one value per sampled token."""

    BLOCK = 64

    def __init__(self, seed: int | None) -> None:
        self.generator = torch.Generator()
        self.generator.manual_seed(seed if seed is not None else torch.seed())
        self._block: list[float] = []
        self._next = 0

    def draw(self) -> float:
        if self._next == len(self._block):
            self._block = torch.rand(self.BLOCK, dtype=torch.float64, generator=self.generator).tolist()
            self._next = 0
        self._next += 1
        return self._block[self._next - 1]


@dataclass
class Sampled:
    """One decode step's choices for a batch. ``top_*`` are (B, K) or None when nobody asked."""

    tokens: list[int]
    logprobs: list[float]
    top_logprobs: list[list[float]] | None = None
    top_ids: list[list[int]] | None = None


def _truncated_probs(logprobs: torch.Tensor, params: list[SamplingParams], truncating: list[bool]) -> torch.Tensor:
    """Probabilities (B, V) from ``logprobs``, zero where top-k / top-p / min-p drop a token (rows
    that do not truncate are left whole). Zeros are written, not exp(-inf): that is a slow path.

    A full sort of the vocabulary is most of the cost, so the ranks are first taken from the
    ``CANDIDATES`` most likely tokens only; every criterion keeps a prefix of the ranking, so when
    each truncating row already drops its last candidate, nothing past the candidates survives
    and the short ranking is exact. Otherwise (a flat distribution under a high top-p) sort all."""
    vocab = logprobs.shape[-1]
    width = min(vocab, max([CANDIDATES] + [p.top_k for p, t in zip(params, truncating) if t and p.top_k < vocab]))
    for k in (width, vocab) if width < vocab else (vocab,):
        ranked_lp, order = logprobs.topk(k, dim=-1)  # (B, k), most likely first
        probs = ranked_lp.exp()
        keep = (probs.cumsum(-1) - probs) <= torch.tensor([p.top_p for p in params])[:, None]
        keep &= torch.arange(k)[None, :] < torch.tensor([min(p.top_k, vocab) for p in params])[:, None]
        keep &= probs >= probs[:, :1] * torch.tensor([p.min_p for p in params])[:, None]
        rows = torch.tensor(truncating)
        if k == vocab or not bool((keep[:, -1] & rows).any()):
            break
    kept = torch.zeros_like(logprobs).scatter_(1, order, probs.masked_fill(~keep, 0.0))
    return torch.where(rows[:, None], kept, logprobs.exp())


def _inverse_cdf(probs: torch.Tensor, uniforms: list[float]) -> torch.Tensor:
    """Per row b, the first token whose float64 CDF exceeds ``uniforms[b]`` x the row's mass (B,):
    the block the target falls in from the blocks' float64 sums, then the token inside it. Never a
    zero-mass token (its CDF equals its predecessor's); rounding between a block's sum and its
    own cumulative sum is clamped to the block's last token with mass."""
    b, vocab = probs.shape
    nblocks = -(-vocab // CDF_BLOCK)
    full = vocab // CDF_BLOCK * CDF_BLOCK
    sums = probs[:, :full].reshape(b, -1, CDF_BLOCK).sum(-1, dtype=torch.float64)  # (B, full blocks)
    if full < vocab:
        sums = torch.cat([sums, probs[:, full:].sum(-1, dtype=torch.float64)[:, None]], dim=1)  # (B, nblocks)
    block_cdf = sums.cumsum(-1)
    target = torch.tensor(uniforms, dtype=torch.float64) * block_cdf[:, -1]  # (B,) in [0, mass)
    block = torch.searchsorted(block_cdf, target[:, None], right=True).squeeze(1).clamp_(max=nblocks - 1)  # (B,)
    before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)[:, None]).squeeze(1), 0.0)
    cols = block[:, None] * CDF_BLOCK + torch.arange(CDF_BLOCK)[None, :]  # (B, CDF_BLOCK)
    inside = cols < vocab
    local = probs.gather(1, cols.clamp(max=vocab - 1)).masked_fill(~inside, 0.0)  # (B, CDF_BLOCK)
    cdf = before[:, None] + local.double().cumsum(-1)
    j = torch.searchsorted(cdf, target[:, None], right=True).squeeze(1)
    last_with_mass = torch.where(local > 0, torch.arange(CDF_BLOCK)[None, :], 0).amax(-1)
    return block * CDF_BLOCK + torch.minimum(j, last_with_mass)


def sample_next(logits: torch.Tensor, params: list[SamplingParams], uniforms: list[float], top_n: int = 0) -> Sampled:
    """Per-row sampling, vectorised over the batch. logits: (B, V) fp32; ``uniforms``: one draw
    in [0, 1) per row (``RowRandom.draw``), used by the rows that do not decode greedily."""
    vocab = logits.shape[-1]
    temps = [p.temperature for p in params]
    greedy_rows = [t < GREEDY_EPS for t in temps]
    if all(greedy_rows):
        logprobs = torch.log_softmax(logits, dim=-1)  # (B, V)
        choice = logits.argmax(dim=-1)
    else:
        scale = torch.tensor([1.0 if g else t for g, t in zip(greedy_rows, temps)])
        scaled = logits if all(t == 1.0 for t in scale.tolist()) else logits / scale[:, None]  # x / 1 == x
        logprobs = torch.log_softmax(scaled, dim=-1)  # (B, V)
        truncating = [p.top_p < 1 or p.top_k < vocab or p.min_p > 0 for p in params]
        probs = _truncated_probs(logprobs, params, truncating) if any(truncating) else logprobs.exp()
        sampled = _inverse_cdf(probs, uniforms)
        choice = torch.where(torch.tensor(greedy_rows), logits.argmax(dim=-1), sampled) if any(greedy_rows) else sampled
    out = Sampled(choice.tolist(), logprobs.gather(1, choice[:, None]).squeeze(1).tolist())
    if top_n > 0:
        values, ids = logprobs.topk(min(top_n, logprobs.shape[-1]), dim=-1)  # (B, K)
        out.top_logprobs, out.top_ids = values.tolist(), ids.tolist()
    return out
