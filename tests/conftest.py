"""What every test shares: the tiers and the helpers' import path.

Tiers (``make test-fast`` runs all but the last):
- unit tests: one part, in-process (losses, packing, parsers, Struct round trips, configs);
- integration tests: one boundary with its real processes and sockets (the gateway against the
  embedded engine, the sandbox's zygote and its attacks, the trainer's ranks on a ring);
- ``e2e``: whole runs (``python -m areal.train``, its AReaL-style scripts, Ray clusters), marked
  ``@pytest.mark.e2e``: the slowest tier, where a run's own outputs are checked.

Harnesses (stand-in engines, agents for the sandbox, run checks) are plain modules beside the
tests, importable by name: this directory is on ``sys.path`` (pytest's rootdir-relative import).
"""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: a whole training run (the slowest tier; make test-fast skips it)")
