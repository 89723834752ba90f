"""Where the tests find the repository: ``ROOT`` (its root) and ``SUPPORT`` (this folder, for
files a subprocess runs or imports by path). One place, so that moving a test file changes
nothing but its folder."""

import os
from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
ROOT = SUPPORT.parents[1]


def support_env(**extra: str) -> dict[str, str]:
    """This process's environment with ``SUPPORT`` first on ``PYTHONPATH`` (and ``extra``): for a
    child process (``python -c ...``) that imports a support module by its bare name."""
    path = os.pathsep.join(filter(None, [str(SUPPORT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, **extra, "PYTHONPATH": path}
