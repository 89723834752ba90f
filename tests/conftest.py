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

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="module")
def model_dir() -> Path:
    from areal.embedded import ensure_embedded_model

    return ensure_embedded_model()


@pytest.fixture(scope="module")
def engine_url(model_dir: Path) -> Iterator[str]:
    """A real embedded engine server (a subprocess) for the module's tests."""
    from areal.engine.client import launch_embedded_engine

    engine = launch_embedded_engine(str(model_dir))
    yield engine.url
    engine.stop()


@pytest.fixture()
def gateway(engine_url: str, model_dir: Path) -> Iterator[Callable[..., Any]]:
    """``gateway(**config)``: a GatewayThread (HTTP + ZeroMQ, on uvloop; tests/gateway_harness.py)
    of its own over the module's embedded engine, stopped after the test."""
    from gateway_harness import GatewayThread

    started: list[GatewayThread] = []

    def start(**config: Any) -> GatewayThread:
        started.append(GatewayThread(engine_url, model_dir, **config))
        return started[-1]

    yield start
    for gw in started:
        gw.stop()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: a whole training run (the slowest tier; make test-fast skips it)")
