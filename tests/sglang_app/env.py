"""A private virtual environment holding SGLang's server code, for the conformance check against it.

SGLang cannot share the project's venv, nor be installed with its dependencies here: it pins
``torch==2.14.1``, ``transformers==5.19.0``, ``openai==2.8.0`` and a stack of CUDA kernels
(flashinfer, sgl-kernel, deep-ep, ...) that no CPU machine can load. Its HTTP front end does not
need them: ``sglang.srt.entrypoints.http_server`` (the FastAPI app, the TokenizerManager that
validates every request, the DetokenizerManager) imports on CPU with the set below, found by
importing it and adding what was missing, one package at a time. So it lives in its own venv,
outside the repository (default ``$AREAL_CACHE/sglang-venv``, ``AREAL_CACHE`` defaulting to
``~/.cache/areal``; ``AREAL_SGLANG_VENV`` overrides), built once:

    python -m venv VENV
    VENV/bin/pip install --no-deps sglang==0.5.23
    VENV/bin/pip install -c constraints.txt torch==2.13.0 fastapi uvicorn ... (SERVER_DEPS)
    VENV/bin/python tests/sglang_app/serve.py --check       # the import must work
    touch VENV/.areal-sglang-ready                           # stamp: written last

Pins: SGLang's own where it pins one (transformers, tokenizers, openai, xgrammar, ...); torch is
the project's CPU wheel (``constraints.txt``), not SGLang's 2.14.1 (a CUDA build). torchvision is
not installed (PyPI's wheel is a CUDA build whose ops cannot load); ``serve.py`` stands in for it.

Invariants:
  * the project's ``.venv`` is never touched: every pip call runs the private venv's own pip;
  * the stamp is written only after the import check passed, so a half-built venv (killed
    mid-install, failed resolve) is rebuilt from scratch on the next call, never used;
  * the stamp records every pin: changing one rebuilds the venv;
  * a failure raises ``SGLangEnvError`` with the failing command and the tail of its output.

    python tests/sglang_app/env.py      # set up (about 3 minutes, 2.5 GB) and print the interpreter
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SGLANG_PIN = "sglang==0.5.23"
# What ``import sglang.srt.entrypoints.http_server`` and the launch path need on CPU; the
# ``==`` pins are SGLang 0.5.23's own (its wheel metadata), triton the release that imports.
SERVER_DEPS = (
    "torch==2.13.0",
    "triton==3.9.0",
    "transformers==5.19.0",
    "tokenizers==0.23.2",
    "sentencepiece==0.2.1",
    "openai==2.8.0",
    "xgrammar==0.2.7",
    "compressed-tensors==0.18.0",
    "apache-tvm-ffi==0.1.11",
    "soundfile==0.13.1",
    "fastapi",
    "uvicorn>=0.51",
    "uvloop",
    "python-multipart",
    "orjson",
    "pydantic",
    "msgspec",
    "pyzmq>=25.1.2",
    "aiohttp",
    "requests",
    "numpy",
    "psutil",
    "pybase64",
    "packaging",
    "pillow",
    "tqdm",
    "ipython",
    "dill",
    "gguf",
    "partial_json_parser",
    "setproctitle",
    "einops",
    "jsonschema",
)
STAMP_NAME = ".areal-sglang-ready"
REPO = Path(__file__).resolve().parents[2]
SERVE = Path(__file__).resolve().with_name("serve.py")


class SGLangEnvError(RuntimeError):
    """The private SGLang venv could not be built or does not import."""


def venv_dir() -> Path:
    cache = Path(os.environ.get("AREAL_CACHE", Path.home() / ".cache" / "areal"))
    return Path(os.environ.get("AREAL_SGLANG_VENV", cache / "sglang-venv"))


def _stamp_text() -> str:
    return "\n".join((SGLANG_PIN, *SERVER_DEPS, (REPO / "constraints.txt").read_text())) + "\n"


def sglang_python() -> Path | None:
    """The private venv's interpreter if the venv is fully set up, else None (no side effects)."""
    root = venv_dir()
    stamp = root / STAMP_NAME
    python = root / "bin" / "python"
    if stamp.is_file() and stamp.read_text() == _stamp_text() and python.exists():
        return python
    return None


def _run(cmd: list[str], log: Path, timeout_s: float) -> None:
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s)
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise SGLangEnvError(f"sglang venv set-up failed (exit {proc.returncode}): {' '.join(cmd)}\nlog {log}, last lines:\n{tail}")


def _base_python() -> str:
    # A venv made from inside another venv must start from the base interpreter.
    return getattr(sys, "_base_executable", None) or sys.executable


def ensure_sglang_env(progress: bool = True, timeout_s: float = 1800.0) -> Path:
    """Build the private venv if needed and return its interpreter; idempotent (stamp file)."""
    ready = sglang_python()
    if ready is not None:
        return ready
    root = venv_dir()
    if root.exists():  # no valid stamp: a partial or outdated venv, never reused
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    log = Path(tempfile.mkstemp(prefix="areal-sglang-venv-", suffix=".log")[1])
    if progress:
        print(f"[sglang_env] building {root} ({SGLANG_PIN}); log {log}", file=sys.stderr)
    _run([_base_python(), "-m", "venv", str(root)], log, 300)
    python = root / "bin" / "python"
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    _run(pip + ["install", "-q", "--no-deps", SGLANG_PIN], log, timeout_s)
    _run(pip + ["install", "-q", "-c", str(REPO / "constraints.txt"), *SERVER_DEPS], log, timeout_s)
    _run([str(python), str(SERVE), "--check"], log, 600)
    (root / STAMP_NAME).write_text(_stamp_text())  # last: marks the venv complete
    if progress:
        print(f"[sglang_env] ready: {python}", file=sys.stderr)
    return python


if __name__ == "__main__":
    print(ensure_sglang_env())
