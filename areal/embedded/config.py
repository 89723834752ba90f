"""What determines each embedded model (every field enters its cache key), and its build record.

``EmbeddedConfig``: the default model (``build.py``); ``ScriptedConfig``: the scripted test
model (``scripted.py``). ``read_build_info`` reads the ``build_info.json`` a build leaves in its
model directory. No torch, so the cache (``areal.embedded``) stays fast on a hit.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

BUILD_INFO = "build_info.json"


@dataclass(frozen=True)
class EmbeddedConfig:
    """Everything that determines the built model (all of it enters the cache key)."""

    seed: int = 0
    vocab_size: int = 8192  # BPE target; the synthetic corpus supports fewer merges, so the real size is smaller
    tokenizer_conversations: int = 20_000  # corpus sample the BPE is trained on
    # Sized for two CPU cores: at batch 16 a 128x3 model learns faster per second than 192x4
    # (the same held-out accuracy after the same samples, in about half the step time).
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    # RoPE holds no position parameters, so this only sets the context the engine and gateway
    # allow: room for the 670-1,300-token prompts real tool and handoff agents send.
    max_positions: int = 4096
    sft_conversations: int = 32_000  # distinct training conversations (each seen once)
    sft_steps: int = 2500  # fewer leave too few GRPO groups that mix right and wrong answers (benchmarks/README.md)
    batch_size: int = 16  # small batches: early training is far below the critical batch size
    lr: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    tool_share: float = 0.04  # calculator tool-call transcripts (long: ~250 tokens each)
    retry_share: float = 0.06  # wrong answer, user complaint, corrected answer
    prompt_loss: bool = True  # also train on non-assistant tokens (see build.tokenize_conversations)
    eval_problems: int = 200  # held-out test problems evaluated at the end of the build
    # One torch thread: a second thread speeds the build on idle cores, but two spin-waiting
    # threads slow down several times over when another process keeps a core busy, while one
    # thread keeps its speed (benchmarks/build.py measures both, same run).
    num_threads: int = 1

    def __post_init__(self) -> None:
        positive = (
            "vocab_size",
            "tokenizer_conversations",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "max_positions",
            "sft_conversations",
            "sft_steps",
            "batch_size",
            "num_threads",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"EmbeddedConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.vocab_size < 512:
            raise ValueError(f"EmbeddedConfig.vocab_size must be >= 512, got {self.vocab_size}")
        if self.hidden_size % self.num_heads:
            raise ValueError("EmbeddedConfig.hidden_size must be divisible by num_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError("EmbeddedConfig.num_heads must be divisible by num_kv_heads")
        if not 0 < self.lr < 1:
            raise ValueError(f"EmbeddedConfig.lr must be in (0, 1), got {self.lr}")
        if not 0 <= self.warmup_steps < self.sft_steps:
            raise ValueError("EmbeddedConfig.warmup_steps must be in [0, sft_steps)")
        if self.weight_decay < 0:
            raise ValueError(f"EmbeddedConfig.weight_decay must be >= 0, got {self.weight_decay}")
        if not (0 <= self.tool_share and 0 <= self.retry_share and self.tool_share + self.retry_share < 1):
            raise ValueError("EmbeddedConfig.tool_share/retry_share must be >= 0 with sum < 1")
        if self.eval_problems < 0:
            raise ValueError(f"EmbeddedConfig.eval_problems must be >= 0, got {self.eval_problems}")


@dataclass(frozen=True)
class ScriptedConfig:
    """Everything that determines the scripted model (all of it enters the cache key)."""

    seed: int = 0
    vocab_size: int = 8192  # BPE target, as the default model's tokenizer
    tokenizer_conversations: int = 5_000  # arithmetic corpus sample the BPE is trained on
    hidden_size: int = 96
    intermediate_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    max_positions: int = 4096  # the context the engine allows, as the default model's
    max_tokens: int = 512  # longest training conversation (SDK prompts in the tests are shorter)
    train_conversations: int = 6_000
    batch_size: int = 8
    lr: float = 2e-3
    warmup_steps: int = 30
    sft_steps: int = 600  # warmup, then cosine decay to 10 % of lr; then the first check
    round_steps: int = 150  # further steps at 10 % of lr before each later check
    max_rounds: int = 6  # later checks before the build gives up
    check_conversations: int = 200  # held-out random conversations in the check
    min_margin: float = 3.0  # logits between the scripted token and the runner-up, every probe position
    min_held_out: float = 0.98  # share of held-out random conversations answered exactly
    sharpen_to: float = 20.0  # logits scaled (x >= 1) until the smallest probe margin is this
    min_sampled_prob: float = 0.9999  # each probe's scripted reply, sampled at temperature 1
    num_threads: int = 1

    def __post_init__(self) -> None:
        positive = (
            "vocab_size",
            "tokenizer_conversations",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "max_positions",
            "max_tokens",
            "train_conversations",
            "batch_size",
            "sft_steps",
            "round_steps",
            "max_rounds",
            "check_conversations",
            "num_threads",
        )
        for name in positive:
            if getattr(self, name) <= 0:
                raise ValueError(f"ScriptedConfig.{name} must be > 0, got {getattr(self, name)}")
        if self.max_tokens > self.max_positions:
            raise ValueError("ScriptedConfig.max_tokens must be <= max_positions")
        if self.hidden_size % self.num_heads or self.num_heads % self.num_kv_heads:
            raise ValueError("ScriptedConfig: hidden_size % num_heads and num_heads % num_kv_heads must be 0")
        if not 0 <= self.warmup_steps < self.sft_steps:
            raise ValueError("ScriptedConfig.warmup_steps must be in [0, sft_steps)")
        if not 0 < self.lr < 1 or self.min_margin <= 0 or not 0 < self.min_held_out <= 1:
            raise ValueError("ScriptedConfig.lr must be in (0, 1), min_margin > 0, min_held_out in (0, 1]")
        if self.sharpen_to < self.min_margin or not 0 < self.min_sampled_prob < 1:
            raise ValueError("ScriptedConfig.sharpen_to must be >= min_margin, min_sampled_prob in (0, 1)")


def read_build_info(model_dir: str | os.PathLike) -> dict:
    """The ``build_info.json`` of a built model directory."""
    return json.loads((Path(model_dir) / BUILD_INFO).read_text())
