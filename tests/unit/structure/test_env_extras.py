"""The ``[envs]`` extra: the environment libraries the adapters run (reasoning-gym, textarena, OpenEnv), each
pinned to exactly the version requirements.lock installs, which is the one CI tests; and the
adapters' install hints name that extra's pins."""

from __future__ import annotations

import re
import tomllib

from paths import ROOT

from areal.agent import openenv_env, textarena_env
from areal.tasks import reasoning_gym


def _name(requirement: str) -> str:
    """A distribution name as PyPI compares them (PEP 503): TextArena, textarena and text_arena alike."""
    return re.sub(r"[-_.]+", "-", requirement).lower()


def _pins(lines: list[str]) -> dict[str, str]:
    pins = {}
    for line in lines:
        name, eq, version = line.split("#")[0].strip().partition("==")
        assert eq and version, f"{line!r} is not pinned with =="
        pins[_name(name)] = version.strip()
    return pins


def test_the_envs_extra_pins_what_requirements_lock_installs():
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    envs = _pins(extras["envs"])
    assert set(envs) == {"openenv-core", "reasoning-gym", "textarena"}
    lock = _pins([line for line in (ROOT / "requirements.lock").read_text().splitlines() if line.strip()])
    assert {name: lock.get(name) for name in envs} == envs
    for module, name in [(textarena_env, "textarena"), (openenv_env, "openenv-core"), (reasoning_gym, "reasoning-gym")]:
        assert f"{name}=={envs[name]}" in module.INSTALL and "'areal-lite[envs]'" in module.INSTALL, module.__name__
