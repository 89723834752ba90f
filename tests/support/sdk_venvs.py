"""Private venvs holding the newest releases of the official SDKs, so that the SDK tests run the
clients users have now beside the lock's (``openai==2.44.0``, capped by openai-agents).

    line       what it holds                              why
    openai3    openai==3.57.0, anthropic==2.14.0          the 3.x line (pydantic-ai needs >=3.31)
    openai2    openai==2.54.0, anthropic==2.14.0          the newest 2.x (verifiers needs >=2.54,<3)

Each is a ``PrivateVenv`` (tests/support/private_venv.py: stamped when complete, rebuilt when a pin
changes) under ``$AREAL_CACHE/sdk-venvs/<line>`` (default ``~/.cache/areal``), holding the two
SDKs, httpx, and what they pull in (httpx2, pydantic, ...; no torch): under a minute each.

    make sdk-venvs      # python tests/support/sdk_venvs.py: set both up, print the interpreters

``need_sdk(line)`` gives a test the interpreter, or a skip that ``AREAL_REQUIRE_SDK_VENVS=1`` turns
into a failure (CI sets it). Bump a pin to the newest release to test it; nothing else changes.
"""

from __future__ import annotations

import os
from pathlib import Path

from private_venv import PrivateVenv, Run

LINES = {
    "openai3": ("openai==3.57.0", "anthropic==2.14.0"),
    "openai2": ("openai==2.54.0", "anthropic==2.14.0"),
}
# beside the SDKs: the runners hand agents an httpx client (areal/agent/httpx2_bridge.py bridges it to
# the SDKs built on httpx2; tests/support/sdk_handed_client.py runs that with the project on sys.path)
EXTRA = ("httpx==0.28.1",)
IMPORT_CHECK = "import openai, anthropic, httpx, httpx2; print(openai.__version__, anthropic.__version__)"


def venv(line: str) -> PrivateVenv:
    root = Path(os.environ.get("AREAL_CACHE", Path.home() / ".cache" / "areal")) / "sdk-venvs" / line
    return PrivateVenv(f"sdk-{line}", root, "\n".join([*LINES[line], *EXTRA]) + "\n")


def pinned_versions(line: str) -> dict[str, str]:
    """package -> the exact version the line pins."""
    return dict(pin.split("==") for pin in LINES[line])


def need_sdk(line: str) -> str:
    """The line's interpreter; else a skip naming how to build it, a failure under
    ``AREAL_REQUIRE_SDK_VENVS=1``."""
    return str(venv(line).need("AREAL_REQUIRE_SDK_VENVS", "make sdk-venvs builds it"))


def _install(pins: tuple[str, ...]):
    def install(python: Path, run: Run) -> None:
        run([str(python), "-m", "pip", "--disable-pip-version-check", "install", "-q", *pins], 900)
        run([str(python), "-c", IMPORT_CHECK], 120)

    return install


def ensure_sdk_venvs(progress: bool = True) -> dict[str, Path]:
    """Build every line's venv if needed; idempotent (stamp files)."""
    return {line: venv(line).ensure(_install((*pins, *EXTRA)), progress) for line, pins in LINES.items()}


if __name__ == "__main__":
    for line, python in ensure_sdk_venvs().items():
        print(line, python)
