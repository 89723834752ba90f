"""Small random models for tests and benchmarks that need real weights but no training."""

from __future__ import annotations

from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def tiny_qwen2(seed: int | None = 0, **config: Any) -> Qwen2ForCausalLM:
    """A random Qwen2ForCausalLM in eval mode: 300 tokens, hidden 64 (MLP twice that), 2 layers of
    4 heads and 2 KV heads, 256 positions, untied; ``config`` sets any other Qwen2Config field.
    Seeded with ``seed`` first (None: not seeded), so the same arguments give the same weights."""
    if seed is not None:
        torch.manual_seed(seed)
    hidden = config.get("hidden_size", 64)
    fields: dict[str, Any] = dict(
        vocab_size=300,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=False,
    )
    return Qwen2ForCausalLM(Qwen2Config(**{**fields, **config})).eval()
