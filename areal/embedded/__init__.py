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
from pathlib import Path

from areal.embedded.config import BUILD_INFO, EmbeddedConfig, ScriptedConfig, read_build_info

__all__ = [
    "BUILD_INFO",
    "EmbeddedConfig",
    "ScriptedConfig",
    "cache_key",
    "embedded_cache_root",
    "ensure_embedded_model",
    "ensure_scripted_model",
    "read_build_info",
]

_SOURCES = ("__init__.py", "config.py", "corpus.py", "tokenizer.py", "build.py")
_SCRIPTED_SOURCES = _SOURCES + ("scripted.py",)
# Builds performed by this process; tests assert that a cache hit leaves it unchanged.
build_count = 0


def embedded_cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` if given, else ``$AREAL_CACHE/embedded`` (``~/.cache/areal/embedded``)."""
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get("AREAL_CACHE", Path.home() / ".cache" / "areal")) / "embedded"


def cache_key(config: EmbeddedConfig | ScriptedConfig) -> str:
    """Hex digest over the builder's source files, the config's class and its fields."""
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
    config: ScriptedConfig | None = None,
    force: bool = False,
) -> Path:
    """The scripted test model's directory (``scripted.py``), built on a miss like the default."""
    return _ensure(config or ScriptedConfig(), cache_dir, progress, force)


def _ensure(config: EmbeddedConfig | ScriptedConfig, cache_dir: str | os.PathLike | None, progress: bool, force: bool) -> Path:
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
        from areal.embedded.scripted import build_scripted_dir

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
