"""A private virtual environment holding TRL, for the GRPO comparison (benchmarks/trl_grpo.py).

TRL does not belong in the project's venv: it pulls accelerate, datasets, pandas and pyarrow at
versions of its own choosing, and nothing of the project needs it. So it lives in its own venv,
outside the repository (default ``$AREAL_CACHE/trl-venv``, ``AREAL_CACHE`` defaulting to
``~/.cache/areal``; ``AREAL_TRL_VENV`` overrides), built once by ``tests/support/private_venv.py``
(stamped when complete, rebuilt when a pin changes):

    python -m venv VENV
    VENV/bin/pip install -c constraints.txt torch==2.13.0 trl==1.16.0 transformers==5.23.0 ...
    VENV/bin/python -c "import torch, trl; from trl import GRPOTrainer"   # the import must work

Pins: trl itself; torch is the project's CPU wheel (``constraints.txt``: letting pip choose pulls
several GB of CUDA packages); transformers, tokenizers and safetensors are the project's own
(``requirements.lock``), which TRL 1.16.0 accepts (``transformers>=4.56.2``), so both trainers load
the model (embedded or SmolLM2) with the same code. The rest is left to TRL's resolver.

    python -m benchmarks.trl_env      # set up and print the interpreter
"""

from __future__ import annotations

import os
from pathlib import Path

from private_venv import PrivateVenv, Run

TRL_PIN = "trl==1.16.0"
DEPS = ("torch==2.13.0", "transformers==5.23.0", "tokenizers==0.23.3", "safetensors==0.8.0")
REPO = Path(__file__).resolve().parents[1]


def venv_dir() -> Path:
    cache = Path(os.environ.get("AREAL_CACHE", Path.home() / ".cache" / "areal"))
    return Path(os.environ.get("AREAL_TRL_VENV", cache / "trl-venv"))


def venv() -> PrivateVenv:
    stamp = "\n".join((TRL_PIN, *DEPS, (REPO / "constraints.txt").read_text())) + "\n"
    return PrivateVenv("trl", venv_dir(), stamp)


def trl_python() -> Path | None:
    """The private venv's interpreter if the venv is fully set up, else None (no side effects)."""
    return venv().python()


def _install(python: Path, run: Run) -> None:
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "install", "-q", "-c", str(REPO / "constraints.txt"), TRL_PIN, *DEPS], 1800)
    check = (
        "import torch, trl; from trl import GRPOConfig, GRPOTrainer; "
        "assert torch.__version__.endswith('+cpu'), torch.__version__; print('trl', trl.__version__)"
    )
    run([str(python), "-c", check], 600)


def ensure_trl_env(progress: bool = True) -> Path:
    """Build the private venv if needed and return its interpreter; idempotent (stamp file)."""
    return venv().ensure(_install, progress)


if __name__ == "__main__":
    print(ensure_trl_env())
