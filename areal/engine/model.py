"""A lean forward for Qwen2/Llama-family HF models, with a preallocated KV cache of row slots.

The embedded model is tiny (3 layers, hidden 128), so a decode step costs the per-op overhead of
HF's module tree, its cache object and its mask builders, not FLOPs. ``LeanForward`` reads the
same weights and does the same arithmetic in about 15 torch ops per layer:

    x ─ rms_norm ─ linear [q|k|v] ─ RoPE (mul, roll, addcmul) ─ index_copy_ k, v into cache
      ─ baddbmm(mask, q, K^T) ─ softmax ─ bmm(·, V) ─ x + linear(·, Wo)
      ─ rms_norm ─ linear [gate|up] ─ silu·up ─ x + linear(·, Wdown)

- Every linear (q|k|v, o, gate|up, down, lm head) is a ``PackedLinear`` (areal/kernels.py): on an
  fp32 CPU, oneDNN on a weight reordered once into its blocked layout, 2 to 2.5x MKL's GEMM on
  AMD cores; elsewhere ``F.linear``.

- RoPE's ``rotate_half`` is a signed swap of each head's halves: the swap is a ``roll`` by half a
  head, the sign is folded into the sine table, so RoPE is one mul, one roll and one addcmul.
  (Folding the rotation into the projection as extra weight rows saves the roll but adds 80% to
  the q|k|v GEMM: a loss on SmolLM2, where decode at few rows is bound by reading the weights.)
- The attention scale and the causal/length mask enter through ``baddbmm``'s alpha and input.
  Prefill (T > 1 tokens per row) uses SDPA instead, whose kernel never holds a T x L matrix.
- Measured (benchmarks/engine.py, ``cpu_tokens_per_s_*_batch``, same engine and sampler): 1.7-2.2x
  HF's forward per CPU-second at 1 row, 1.4-1.5x at 16 rows, where most of a step is now GEMMs
  near the core's fp32 rate and attention reading the cache (memory-bound; grows with length).
- torch.compile is not used: inductor needs a C++ toolchain at start-up and recompiles as the
  batch size and length change (tens of seconds per engine start; the tests start many).

KV cache layout, one (K, V) pair per layer, grown by doubling (rows up to ``slots``, positions up
to the context length) only when a batch needs more, so a large-context model with a few live rows
holds a small cache; bytes = 2 x layers x allocated rows x kv_heads x capacity x head_dim x 4:

    K[layer]: (rows, kv_heads, capacity, head_dim)      row s = row s of the decode batch
    write:  flat view (rows*kv_heads*capacity, head_dim).index_copy_(0, idx, k)    no concat
    read:   K[:n].view(n*kv_heads, capacity, head_dim)[:, :L]                       a view

Invariants:
- Rows of a batch occupy slots 0..n-1 (``SlotBatch`` keeps them compact); a chunk of rows is a
  contiguous slot range ``start..start+n``, so reads are views, never gathers.
- Query (b, t) at absolute position p attends to cache positions 0..p of its own slot only;
  whatever lies beyond p in a slot (padding of a prefill, a retired row's tail) is masked and is
  overwritten before it is ever attended to.
- Norms and embeddings are the HF model's own tensors, so in-place weight updates reach them; the
  linears' weights are copies (fused, or packed for oneDNN): call ``refresh()`` after every
  weight update.
- Logits match HF's forward to float noise (~1e-6; tests/unit/engine/test_engine_lean.py checks 1e-4).

Covered: model_type qwen2 / llama, SiLU MLP, full attention, RoPE types whose frequencies are
static (default, linear, llama3), tied or untied lm_head, q/k/v/o/MLP biases present or absent.
Not covered (``lean_unsupported`` says why and the engine falls back to HF's forward): sliding
window, dynamic RoPE, q/k norms (Qwen3), MoE, quantised weights, anything else.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from areal.kernels import PackedLinear, onednn_available

LEAN_MODEL_TYPES = ("qwen2", "llama")
STATIC_ROPE_TYPES = ("default", "linear", "llama3")
INITIAL_CAPACITY = 256  # positions per slot allocated up front (grown by doubling when needed)
INITIAL_ROWS = 4  # slots allocated up front (grown by doubling up to ``slots``)
MIN_SHARED_PREFIX = 8  # shorter shared prefixes are prefilled with each row (not worth a pass)
LEAN_DTYPES = (torch.float32, torch.bfloat16)  # the served dtype; the cache and RoPE tables follow it


def lean_unsupported(model: torch.nn.Module) -> str | None:
    """Why ``LeanForward`` cannot serve ``model`` (None: it can)."""
    cfg = model.config
    if cfg.model_type not in LEAN_MODEL_TYPES:
        return f"model_type {cfg.model_type!r} is not one of {LEAN_MODEL_TYPES}"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"hidden_act {cfg.hidden_act!r} is not silu"
    layer_types = getattr(cfg, "layer_types", None) or []
    if getattr(cfg, "use_sliding_window", False) or any(t != "full_attention" for t in layer_types):
        return "sliding-window attention"
    rope = getattr(model.model.rotary_emb, "rope_type", "default")
    if rope not in STATIC_ROPE_TYPES:
        return f"rope_type {rope!r} has position-dependent frequencies"
    attn = model.model.layers[0].self_attn
    if any(hasattr(attn, n) for n in ("q_norm", "k_norm")):
        return "q/k norms"
    if any(p.dtype not in LEAN_DTYPES for p in model.parameters()):
        return f"parameters are not all one of {LEAN_DTYPES}"
    return None


class LeanForward:
    """The HF model's forward over a slot KV cache (see module docstring)."""

    def __init__(self, model: torch.nn.Module, slots: int) -> None:
        reason = lean_unsupported(model)
        if reason is not None:
            raise ValueError(f"LeanForward cannot serve this model: {reason}")
        cfg = model.config
        self.model = model
        self.slots = slots
        first = next(model.parameters())
        self.device, self.dtype = first.device, first.dtype  # where and in what the cache lives
        self.heads = int(cfg.num_attention_heads)
        self.kv_heads = int(getattr(cfg, "num_key_value_heads", None) or self.heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // self.heads)
        self.group = self.heads // self.kv_heads
        self.eps = float(cfg.rms_norm_eps)
        self.context_len = int(getattr(cfg, "max_position_embeddings", 32768))
        self.scale = self.head_dim**-0.5
        rotary = model.model.rotary_emb
        pos = torch.arange(self.context_len, dtype=torch.float32)
        freqs = pos[:, None] * rotary.inv_freq.float().cpu()[None, :]  # as HF: position * inv_freq in fp32
        emb = torch.cat([freqs, freqs], dim=-1)  # (context, head_dim)
        # as HF: computed in fp32, cast to the activations' dtype
        self.cos = (emb.cos() * rotary.attention_scaling).to(self.device, self.dtype)
        sin = emb.sin() * rotary.attention_scaling
        half = self.head_dim // 2
        # rotate_half(x) * sin == roll(x, half) * [-sin | sin]: the sign lives in the table
        self.sin = torch.cat([-sin[:, :half], sin[:, half:]], dim=-1).to(self.device, self.dtype)
        self.onednn = onednn_available(self.device, self.dtype)
        self.rows_allocated = 0
        self.capacity = 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self._grow(min(INITIAL_ROWS, slots), min(INITIAL_CAPACITY, self.context_len))
        self.refresh()

    def refresh(self) -> None:
        """Rebuild the fused projections and the packed weights from the model's current weights
        (after any update)."""
        self.layers: list[dict[str, Any]] = []
        with torch.no_grad():
            for layer in self.model.model.layers:
                a, m = layer.self_attn, layer.mlp
                ws = [a.q_proj.weight, a.k_proj.weight, a.v_proj.weight]
                biases = [a.q_proj.bias, a.k_proj.bias, a.v_proj.bias]
                qkv_bias = None
                if any(b is not None for b in biases):
                    q_b, k_b, v_b = (
                        b if b is not None else torch.zeros(w.shape[0], dtype=w.dtype, device=w.device) for b, w in zip(biases, ws)
                    )
                    qkv_bias = torch.cat([q_b, k_b, v_b])
                gu_bias = None
                if m.gate_proj.bias is not None:
                    gu_bias = torch.cat([m.gate_proj.bias, m.up_proj.bias]).contiguous()
                packed = self.onednn
                self.layers.append(
                    {
                        "norm1": layer.input_layernorm.weight,
                        "norm2": layer.post_attention_layernorm.weight,
                        "qkv": PackedLinear(torch.cat(ws).contiguous(), qkv_bias, packed),
                        "o": PackedLinear(a.o_proj.weight, a.o_proj.bias, packed),
                        "gu": PackedLinear(torch.cat([m.gate_proj.weight, m.up_proj.weight]).contiguous(), gu_bias, packed),
                        "down": PackedLinear(m.down_proj.weight, m.down_proj.bias, packed),
                    }
                )
            self.lm_head = PackedLinear(self.model.lm_head.weight, getattr(self.model.lm_head, "bias", None), self.onednn)
        self.embed = self.model.model.embed_tokens.weight
        self.final_norm = self.model.model.norm.weight

    def _grow(self, rows: int, capacity: int) -> None:
        """Reallocate every layer's cache as (rows, kv_heads, capacity, head_dim), keeping contents."""
        shape = (rows, self.kv_heads, capacity, self.head_dim)
        old_rows, old_cap = self.rows_allocated, self.capacity
        keys = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.model.model.layers]
        values = [torch.zeros(shape, dtype=self.dtype, device=self.device) for _ in self.model.model.layers]
        for new, prev in zip(keys + values, self.keys + self.values):
            new[:old_rows, :, :old_cap].copy_(prev)
        self.keys, self.values, self.rows_allocated, self.capacity = keys, values, rows, capacity

    def reserve(self, rows: int, length: int) -> None:
        """Make room for slots 0..rows-1 with ``length`` positions each."""
        if rows > self.slots:
            raise ValueError(f"{rows} rows exceed the {self.slots} cache slots")
        if length > self.context_len:
            raise ValueError(f"{length} positions exceed the context length {self.context_len}")
        if rows > self.rows_allocated or length > self.capacity:
            self._grow(
                min(self.slots, max(rows, 2 * self.rows_allocated if rows > self.rows_allocated else 0, self.rows_allocated)),
                min(self.context_len, max(length, 2 * self.capacity if length > self.capacity else 0, self.capacity)),
            )

    def move(self, src: list[int], dst: list[int], length: int) -> None:
        """Copy slots ``src`` to slots ``dst`` (first ``length`` positions): batch compaction."""
        s, t = torch.tensor(src, device=self.device), torch.tensor(dst, device=self.device)
        for cache in self.keys + self.values:
            cache[t, :, :length] = cache[s, :, :length]

    def forward(self, ids: torch.Tensor, positions: torch.Tensor, start: int, last: torch.Tensor) -> torch.Tensor:
        """Run ``ids`` (n, T) at ``positions`` (n, T) for slots start..start+n, writing their K/V;
        returns the fp32 logits (n, V) of position ``last[b]`` (an index into T) of each row, on
        the CPU (where sampling runs). The inputs may be on the CPU: they move to the model's device.

        With T > 1 (prefill), positions past ``last[b]`` are right padding: they are left out of
        every projection and MLP (the rows' real tokens are packed into one (N, D) batch) and
        only enter attention as masked-out query rows; their cache positions are not written."""
        dev = self.device
        ids, positions, last = ids.to(dev), positions.to(dev), last.to(dev)
        n, t = ids.shape
        h, kv, g, d = self.heads, self.kv_heads, self.group, self.head_dim
        length = int(positions.max()) + 1
        self.reserve(start + n, length)
        cap = self.capacity
        # Prefill packs the real tokens: ``real`` indexes the (n*T) grid, row-major (N,).
        real = (torch.arange(t, device=dev)[None, :] <= last[:, None]).reshape(-1).nonzero().squeeze(1) if t > 1 else None
        flat_pos = positions.reshape(-1) if real is None else positions.reshape(-1)[real]  # (N,)
        # Shared by every layer: RoPE rows, cache write indices, additive mask.
        cos = self.cos[flat_pos][:, None, :]  # (N, 1, d)
        sin = self.sin[flat_pos][:, None, :]
        slot = torch.arange(start, start + n, device=dev)[:, None, None]  # (n, 1, 1)
        write = ((slot * kv + torch.arange(kv, device=dev)[None, None, :]) * cap + positions[:, :, None]).reshape(n * t, kv)
        write = (write if real is None else write[real]).reshape(-1)  # (N*kv,)
        visible = torch.arange(length, device=dev)[None, None, :] <= positions[:, :, None]  # (n, T, L)
        if t == 1:  # additive, one row per (row, kv head): baddbmm's input
            mask = torch.zeros(n, length, dtype=self.dtype, device=dev).masked_fill_(~visible[:, 0], float("-inf"))
            mask = mask[:, None, None, :].expand(n, kv, 1, length).reshape(n * kv, 1, length)
        else:
            mask = visible[:, None]  # (n, 1, T, L) boolean: SDPA's
        flat_ids = ids.reshape(-1) if real is None else ids.reshape(-1)[real]
        x = F.embedding(flat_ids, self.embed)  # (N, D); N = n when decoding
        qk_width, v_width = (h + kv) * d, kv * d
        for p, k_cache, v_cache in zip(self.layers, self.keys, self.values):
            y = F.rms_norm(x, (x.shape[-1],), p["norm1"], self.eps)
            proj = p["qkv"](y)  # (N, [q|k|v])
            qk = proj[:, :qk_width].view(-1, h + kv, d)
            qk = torch.addcmul(qk * cos, qk.roll(d // 2, dims=-1), sin)  # RoPE: x*cos + rotate_half(x)*sin
            k_flat = k_cache.view(-1, d)
            k_flat.index_copy_(0, write, qk[:, h:].reshape(-1, d))
            v_cache.view(-1, d).index_copy_(0, write, proj[:, qk_width : qk_width + v_width].reshape(-1, d))
            if t == 1:  # decode: GQA as batched matmuls over (row, kv head), mask and scale fused in
                q = qk[:, :h].reshape(n * kv, g, d)
                keys = k_cache[start : start + n].view(n * kv, cap, d)[:, :length]  # (n*kv, L, d)
                vals = v_cache[start : start + n].view(n * kv, cap, d)[:, :length]
                scores = torch.baddbmm(mask, q, keys.transpose(1, 2), alpha=self.scale)  # (n*kv, g, L)
                probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(vals.dtype)  # as HF: softmax in fp32
                out = torch.bmm(probs, vals).view(n, h * d)  # (n*kv, g, d) -> (n, H*d)
            else:  # prefill: SDPA's memory-bounded kernel (a T x L score matrix per head would not be)
                keys = k_cache[start : start + n, :, :length]  # (n, kv, L, d)
                vals = v_cache[start : start + n, :, :length]
                q = qk.new_zeros(n * t, h, d).index_copy_(0, real, qk[:, :h])  # padded back to the grid
                out = F.scaled_dot_product_attention(
                    q.view(n, t, h, d).transpose(1, 2), keys, vals, attn_mask=mask, scale=self.scale, enable_gqa=g > 1
                )  # (n, H, T, d)
                out = out.transpose(1, 2).reshape(n * t, h * d)[real]  # (N, H*d)
            x = x + p["o"](out)
            y = F.rms_norm(x, (x.shape[-1],), p["norm2"], self.eps)
            gu = p["gu"](y)  # (n*T, 2I)
            inner = gu.shape[-1] // 2
            act = F.silu(gu[:, :inner]) * gu[:, inner:]
            x = x + p["down"](act)
        if t > 1:
            x = x[(last + 1).cumsum(0) - 1]  # (n, D): each row's last real token, the one that is sampled
        x = F.rms_norm(x, (x.shape[-1],), self.final_norm, self.eps)
        return self.lm_head(x).float().cpu()  # (n, V)


class SlotBatch:
    """Rows decoding together on a ``LeanForward``: row i of the batch lives in cache slot i.

    Same interface as ``batch.DecodeBatch`` (HF forward): ``rows``, ``prefill``, ``decode``,
    ``set_next``, ``remove``. No padding between rows in decode: each row attends to its own
    length. Retiring rows fills their slots with the last live rows (one copy per moved row), so
    the live rows stay in slots 0..B-1 and their order in ``rows`` may change."""

    def __init__(self, lean: LeanForward) -> None:
        self.lean = lean
        self.rows: list[Any] = []
        self.next_tok = torch.zeros(0, dtype=torch.long)  # (B,) last sampled token, not yet fed
        self.next_pos = torch.zeros(0, dtype=torch.long)  # (B,) its position = tokens cached so far

    def prefill(self, model: torch.nn.Module, rows: list[Any]) -> torch.Tensor:
        """Prefill ``rows`` (prompt + any output so far) into the next free slots, right-padded
        as one group; returns their next-token logits (b, V). ``model`` is unused (the lean
        forward holds it); kept for ``DecodeBatch``'s signature."""
        if len(self.rows) + len(rows) > self.lean.slots:
            raise ValueError(f"{len(self.rows)} + {len(rows)} rows exceed the {self.lean.slots} cache slots")
        seqs = [r.input_ids + r.output_ids for r in rows]
        first = len(self.rows)
        # A prefix every row shares (a system prompt, a chat template's header) is run once, in
        # the first row's slot, and its K/V copied to the others; each row keeps >= 1 own token,
        # whose logits are the ones sampled.
        shared = len(os.path.commonprefix(seqs)) if len(seqs) > 1 else 0  # lists compare element-wise
        shared = min(shared, min(len(s) for s in seqs) - 1)
        if shared < MIN_SHARED_PREFIX:
            shared = 0
        else:
            self.lean.reserve(first + len(rows), shared)
            self.lean.forward(torch.tensor([seqs[0][:shared]]), torch.arange(shared)[None, :], first, torch.tensor([shared - 1]))
            self.lean.move([first] * (len(rows) - 1), list(range(first + 1, first + len(rows))), shared)
        lengths = torch.tensor([len(s) for s in seqs])  # (b,)
        width = int(lengths.max()) - shared
        ids = torch.zeros(len(rows), width, dtype=torch.long)  # (b, T); padding sits past each row's end
        for i, s in enumerate(seqs):
            ids[i, : len(s) - shared] = torch.tensor(s[shared:])
        positions = torch.arange(shared, shared + width)[None, :].expand(len(rows), width)
        logits = self.lean.forward(ids, positions, first, lengths - shared - 1)
        self.rows += rows
        self.next_tok = torch.cat([self.next_tok, torch.zeros(len(rows), dtype=torch.long)])
        self.next_pos = torch.cat([self.next_pos, lengths])
        return logits

    def decode(self, model: torch.nn.Module) -> torch.Tensor:
        """Feed every row's last sampled token; returns next-token logits (B, V)."""
        n = len(self.rows)
        logits = self.lean.forward(self.next_tok[:, None], self.next_pos[:, None], 0, torch.zeros(n, dtype=torch.long))
        self.next_pos = self.next_pos + 1
        return logits

    def set_next(self, first_row: int, tokens: list[int]) -> None:
        self.next_tok[first_row : first_row + len(tokens)] = torch.tensor(tokens)

    def remove(self, drop: Callable[[Any], bool]) -> list[Any]:
        """Take the rows matching ``drop`` out of the batch; return them."""
        flags = [drop(r) for r in self.rows]
        if not any(flags):
            return []
        gone = [r for r, f in zip(self.rows, flags) if f]
        live = len(self.rows) - len(gone)
        holes = [i for i in range(live) if flags[i]]
        movers = [i for i in range(live, len(self.rows)) if not flags[i]]  # as many as holes
        if holes:
            self.lean.move(movers, holes, int(self.next_pos[movers].max()))
            for src, dst in zip(movers, holes):
                self.rows[dst] = self.rows[src]
            dst_t, src_t = torch.tensor(holes), torch.tensor(movers)
            self.next_tok[dst_t] = self.next_tok[src_t]
            self.next_pos[dst_t] = self.next_pos[src_t]
        del self.rows[live:]
        self.next_tok, self.next_pos = self.next_tok[:live].clone(), self.next_pos[:live].clone()
        return gone
