"""The embedded default model: built offline at first use, cached by content hash.

``ensure_embedded_model()`` returns a directory that ``AutoTokenizer`` / ``AutoModelForCausalLM``
load: a tiny Qwen2 (float32 safetensors) with a small byte-level BPE and the project's ChatML
template, SFT-trained on synthetic arithmetic word problems so that it is right sometimes and
wrong often (room for RL). See ``corpus.py`` (task, reward), ``tokenizer.py`` (BPE, template),
``build.py`` (SFT, evaluation, CLI).

A second model is built the same way for tests of mechanics: ``ensure_scripted_model()`` (see
``scripted.py``), whose greedy output is a fixed function of the conversation's shape on every
build, so that a test needing a tool call gets one whatever CPU built the model.

Cache layout and invariants::

    $AREAL_CACHE/embedded/            (AREAL_CACHE defaults to ~/.cache/areal; or cache_dir)
        <key>/                        complete model dir (default or scripted); appears only by an atomic rename
            config.json model.safetensors generation_config.json tokenizer.json ...
            build_info.json           config, key, params, build seconds, held-out accuracy
        <key>.lock                    flock held while building <key>
        .<key>.XXXX/                  a build in progress (removed if the build fails)

- ``<key>`` hashes the builder's source files and its config (whose class names the model):
  editing either rebuilds.
- A present ``<key>/`` is complete (rename is atomic), so a cache hit takes no lock, imports no
  torch and returns in milliseconds. Concurrent builders serialise on the lock; the second finds
  the finished directory and returns it.

This module stays free of torch/transformers imports so that the cache hit is fast.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

__all__ = ["EmbeddedConfig", "ensure_embedded_model", "ensure_scripted_model", "embedded_cache_root", "cache_key"]

_SOURCES = ("__init__.py", "corpus.py", "tokenizer.py", "build.py")
_SCRIPTED_SOURCES = _SOURCES + ("scripted.py",)
BUILD_INFO = "build_info.json"
# Builds performed by this process; tests assert that a cache hit leaves it unchanged.
build_count = 0


@dataclass(frozen=True)
class EmbeddedConfig:
    """Everything that determines the built model (all of it enters the cache key)."""

    seed: int = 0
    vocab_size: int = 8192  # BPE target; the synthetic corpus supports fewer pieces (see report)
    tokenizer_conversations: int = 20_000  # corpus sample the BPE is trained on
    # Sized for the 2-core budget: at batch 16 a 128x3 model learns faster per second than
    # 192x4 (measured: same held-out accuracy after 24k samples at half the step time).
    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int = 2
    max_positions: int = 512
    sft_conversations: int = 32_000  # distinct training conversations (each seen once)
    sft_steps: int = 2500  # 2000: 18 % sampled, too few informative GRPO groups; 3000: 50 %
    batch_size: int = 16  # small batches: early training is far below the critical batch size
    lr: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    tool_share: float = 0.04  # calculator tool-call transcripts (long: ~250 tokens each)
    retry_share: float = 0.06  # wrong answer, user complaint, corrected answer
    prompt_loss: bool = True  # also train on non-assistant tokens (see build.tokenize_conversations)
    eval_problems: int = 200  # held-out test problems evaluated at the end of the build
    # One torch thread: on 2 idle cores a second thread buys 1.5x, but two spin-waiting threads
    # lose 3-4x (and far more under heavier load) when another process keeps a core busy, while
    # one thread keeps its speed (benchmarks/build.py measures both, same run).
    num_threads: int = 1

    def __post_init__(self) -> None:
        positive = ("vocab_size", "tokenizer_conversations", "hidden_size", "intermediate_size",
                    "num_layers", "num_heads", "num_kv_heads", "max_positions",
                    "sft_conversations", "sft_steps", "batch_size", "num_threads")
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


def embedded_cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` if given, else ``$AREAL_CACHE/embedded`` (``~/.cache/areal/embedded``)."""
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get("AREAL_CACHE", Path.home() / ".cache" / "areal")) / "embedded"


def cache_key(config: "EmbeddedConfig | ScriptedConfig") -> str:
    """Hex digest over the builder's source files, the config's class and its fields."""
    from areal.embedded.scripted import ScriptedConfig

    sources = _SCRIPTED_SOURCES if isinstance(config, ScriptedConfig) else _SOURCES
    h = hashlib.sha256()
    here = Path(__file__).parent
    for name in sources:
        h.update(name.encode() + b"\0" + (here / name).read_bytes() + b"\0")
    h.update(type(config).__name__.encode() + b"\0")
    h.update(json.dumps(dataclasses.asdict(config), sort_keys=True).encode())
    return h.hexdigest()[:16]


def ensure_embedded_model(
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    config: EmbeddedConfig | None = None,
    force: bool = False,
) -> Path:
    """The model directory for ``config`` (default config if None), building it on a miss.

    ``cache_dir`` replaces ``$AREAL_CACHE/embedded`` as the folder holding ``<key>/`` dirs.
    ``force`` rebuilds even on a hit (the old directory is swapped out atomically).
    """
    return _ensure(config or EmbeddedConfig(), cache_dir, progress, force)


def ensure_scripted_model(
    cache_dir: str | os.PathLike | None = None,
    progress: bool = True,
    config: "ScriptedConfig | None" = None,
    force: bool = False,
) -> Path:
    """The scripted test model's directory (``scripted.py``), built on a miss like the default."""
    from areal.embedded.scripted import ScriptedConfig

    return _ensure(config or ScriptedConfig(), cache_dir, progress, force)


def _ensure(config: "EmbeddedConfig | ScriptedConfig", cache_dir: str | os.PathLike | None,
            progress: bool, force: bool) -> Path:
    global build_count
    root = embedded_cache_root(cache_dir)
    key = cache_key(config)
    final = root / key
    if not force and (final / BUILD_INFO).is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{key}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not force and (final / BUILD_INFO).is_file():
            return final  # a concurrent builder finished while we waited
        from areal.embedded.build import build_model_dir  # heavy imports only on a miss
        from areal.embedded.scripted import ScriptedConfig, build_scripted_dir

        tmp = Path(tempfile.mkdtemp(prefix=f".{key}.", dir=root))
        try:
            if isinstance(config, ScriptedConfig):
                build_scripted_dir(config, tmp, progress=progress, key=key)
            else:
                build_model_dir(config, tmp, progress=progress, key=key)
            if final.exists():  # --force: move the old one aside, then swap in the new one
                old = Path(tempfile.mkdtemp(prefix=f".{key}.old.", dir=root))
                os.rename(final, old / "model")
                os.rename(tmp, final)
                shutil.rmtree(old)
            else:
                os.rename(tmp, final)
        finally:
            if tmp.exists():  # the build failed: leave no half-written directory behind
                shutil.rmtree(tmp)
        build_count += 1
    return final


def read_build_info(model_dir: str | os.PathLike) -> dict:
    """The ``build_info.json`` of a built model directory."""
    return json.loads((Path(model_dir) / BUILD_INFO).read_text())
