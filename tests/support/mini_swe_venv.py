"""The private virtual environment holding mini-swe-agent, for ``rollout.agent=mini-swe``
(areal/agent/mini_swe.py) and its tests.

mini-swe-agent 2.4.6 cannot share the project's venv: its litellm pulls botocore, which needs
``python-dateutil<3``, where requirements.lock pins ``python-dateutil==4.0.0`` (pip's resolver
against requirements.lock and constraints.txt: ResolutionImpossible); it also resolves to openai
3.x and pydantic 2.14, past the agent SDKs' pins. So it lives in its own venv
(``areal.agent.mini_swe.mini_swe_venv_dir``: ``$AREAL_MINI_SWE_VENV``, else
``$AREAL_CACHE/mini-swe-venv``, else ``~/.cache/areal/mini-swe-venv``), built once by
``tests/support/private_venv.py`` (stamped when complete, rebuilt when a pin changes):

    python -m venv VENV
    VENV/bin/pip install mini-swe-agent==2.4.6 litellm==1.110.2 openai==3.57.0   # ~80 packages, no torch
    VENV/bin/python -c "import minisweagent.agents.default, minisweagent.models.litellm_model, ..."

    make mini-swe-venv     # python tests/support/mini_swe_venv.py: set up, print the interpreter

``need_mini_swe()`` gives a test the interpreter, or a skip that ``AREAL_REQUIRE_MINI_SWE=1``
turns into a failure.
"""

from __future__ import annotations

from pathlib import Path

from private_venv import PrivateVenv, Run

from areal.agent.mini_swe import PINS, mini_swe_venv_dir

# What the adapter's private side imports (areal/agent/mini_swe.py), offline: the cost map is the
# one litellm ships, never fetched.
IMPORT_CHECK = (
    "import os; os.environ['LITELLM_LOCAL_MODEL_COST_MAP'] = 'True'; os.environ['MSWEA_SILENT_STARTUP'] = '1'; "
    "import minisweagent, minisweagent.agents.default, minisweagent.models.litellm_model, "
    "minisweagent.environments.local, minisweagent.config; print('mini-swe-agent', minisweagent.__version__)"
)


def venv() -> PrivateVenv:
    return PrivateVenv("mini-swe", mini_swe_venv_dir(), "\n".join(PINS) + "\n")


def need_mini_swe() -> str:
    """The private venv's interpreter; else a skip naming how to build it, a failure under
    ``AREAL_REQUIRE_MINI_SWE=1``."""
    return str(venv().need("AREAL_REQUIRE_MINI_SWE", "make mini-swe-venv builds it"))


def _install(python: Path, run: Run) -> None:
    pip = [str(python), "-m", "pip", "--disable-pip-version-check"]
    run([*pip, "install", "-q", *PINS], 1800)
    run([str(python), "-c", IMPORT_CHECK], 300)


def ensure_mini_swe_env(progress: bool = True) -> Path:
    """Build the private venv if needed and return its interpreter; idempotent (stamp file)."""
    return venv().ensure(_install, progress)


if __name__ == "__main__":
    print(ensure_mini_swe_env())
