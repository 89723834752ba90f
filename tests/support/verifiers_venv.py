"""The private virtual environment holding verifiers, for ``rollout.agent=verifiers:...``
(areal/agent/verifiers_env.py) and its tests.

verifiers 0.4.0 cannot share the project's venv: it needs ``openai>=2.54,<3`` and
``pydantic>=2.12.3``, where the agent SDKs pin ``openai==2.44.0`` (openai-agents 0.4.2 caps it) and
``pydantic==2.12.0`` (camel-ai caps it). So it lives in its own venv
(``areal.agent.verifiers_env.verifiers_venv_dir``: ``$AREAL_VERIFIERS_VENV``, else
``$AREAL_CACHE/verifiers-venv``, else ``~/.cache/areal/verifiers-venv``), built once by
``tests/support/private_venv.py`` (stamped when complete, rebuilt when a pin changes):

    python -m venv VENV
    VENV/bin/pip install verifiers==0.4.0 openai==2.54.0     # about a minute, ~100 packages, no torch
    VENV/bin/python -c "import verifiers.v1, openai, mcp, httpx2, tenacity, certifi, aiohttp"

    make verifiers-venv     # python tests/support/verifiers_venv.py: set up, print the interpreter

``need_verifiers()`` gives a test the interpreter, or a skip that ``AREAL_REQUIRE_VERIFIERS=1``
turns into a failure.
"""

from __future__ import annotations

from pathlib import Path

from private_venv import PrivateVenv, Run

from areal.agent.verifiers_env import OPENAI_PIN, VERIFIERS_PIN, verifiers_venv_dir

# What the chat program of verifiers' null/bash harnesses imports (areal/agent/verifiers_env.py runs it
# with this venv's interpreter), and the call log's aiohttp.
IMPORT_CHECK = "import verifiers.v1, openai, mcp, httpx, httpx2, tenacity, certifi, aiohttp; print('verifiers', verifiers.__version__)"


def venv() -> PrivateVenv:
    return PrivateVenv("verifiers", verifiers_venv_dir(), f"{VERIFIERS_PIN}\n{OPENAI_PIN}\n")


def need_verifiers() -> str:
    """The private venv's interpreter; else a skip naming how to build it, a failure under
    ``AREAL_REQUIRE_VERIFIERS=1``."""
    return str(venv().need("AREAL_REQUIRE_VERIFIERS", "make verifiers-venv builds it"))


def _install(python: Path, run: Run) -> None:
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "install", "-q", VERIFIERS_PIN, OPENAI_PIN], 1800)
    run([str(python), "-c", IMPORT_CHECK], 300)


def ensure_verifiers_env(progress: bool = True) -> Path:
    """Build the private venv if needed and return its interpreter; idempotent (stamp file)."""
    return venv().ensure(_install, progress)


if __name__ == "__main__":
    print(ensure_verifiers_env())
