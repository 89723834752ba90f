"""What every test shares: the fixtures of more than one folder (the tiers' marker, ``e2e``, is
registered in pyproject.toml, so that benchmarks/tests sees it too).

The tiers are folders (tests/README.md says how to run each):
- ``unit/<part>/``: one part, in-process (losses, packing, parsers, Struct round trips, configs);
- ``integration/<boundary>/``: one boundary with its real processes and sockets (the gateway
  against the embedded engine, the sandbox's zygote and its attacks, a trainer subprocess on a ring);
- ``e2e/``: whole runs (``python -m areal.train``, its AReaL-style scripts, Ray clusters, torchrun
  ranks), every one marked ``@pytest.mark.e2e``: the slowest tier, which ``make test-fast`` skips.
  A whole run elsewhere (a trainer subprocess trained to its end, a benchmark's quick run) carries
  the marker too.

Harnesses and helpers (stand-in engines, agents for the sandbox, run checks, the trainer's test
world) are plain modules in ``support/``, imported by bare name: pyproject.toml puts that folder
on ``sys.path`` (pytest's ``pythonpath``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The order the workers take the tests in: the long ones first (the benchmark smoke, then the
    e2e and integration tiers, as collected), then those that need the embedded model's agentic
    variant (marked ``agent_model``), then the unit tier. CI builds that variant beside the test
    run (.ci/run), and a test that started first would wait minutes for it while its worker does
    nothing else; by the time the long tiers are done it is built, and the unit tier's many short
    files keep both workers busy to the end instead of one long agentic run holding the last of it."""

    def rank(item: pytest.Item) -> int:
        if item.get_closest_marker("agent_model") is not None:
            return 1
        return 2 if item.nodeid.startswith("tests/unit/") else 0

    items.sort(key=rank)  # stable: within a rank, the collection order


# Files whose tests are independent whole runs with no shared fixture: each its own unit, so that
# the workers share them out.
SPREAD_FILES = {"benchmarks/tests/test_bench_modules_quick.py"}


def xdist_unit(nodeid: str) -> str:
    """The unit of work a pytest-xdist worker takes whole: the test's file, so that its module
    fixtures (an engine, a gateway, a zygote) start once; every test that starts a Ray cluster in
    one unit, so that two clusters never start side by side on one machine."""
    path, _, test = nodeid.partition("::")
    if Path(path).name.startswith("test_ray_") or "[ray_" in test:
        return "ray"
    return nodeid if path in SPREAD_FILES else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``make test``'s workers (``-n JOBS --dist loadfile``) take the units of ``xdist_unit``. Its rule
    lives here, on the controller, which sees test ids only: pytest-xdist's ``xdist_group`` markers
    do not reach it under pytest 9 (the suffix xdist writes into ``item._nodeid`` is no longer part
    of the id), and each test then was a unit of its own, its file's fixtures started again on
    every worker that took one of its tests."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class FileUnits(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_unit(nodeid)

    return FileUnits(config, log)


def _engine(model_dir: Path) -> Iterator[str]:
    from areal.engine.launch import launch_embedded_engine

    engine = launch_embedded_engine(str(model_dir))
    yield engine.url
    engine.stop()


def _gateway_thread(engine_url: str, model_dir: Path) -> Iterator[Any]:
    from gateway_harness import GatewayThread

    gw = GatewayThread(engine_url, model_dir)
    yield gw
    gw.stop()


@pytest.fixture(scope="module")
def model_dir() -> Path:
    """The embedded model (built once, then a cache hit)."""
    from areal.embedded import ensure_embedded_model

    return ensure_embedded_model()


@pytest.fixture(scope="session")
def embedded_engine_url() -> Iterator[str]:
    """One embedded engine server (a subprocess) on the embedded model, for the whole session: the
    modules that use it leave its weights as they found them."""
    from areal.embedded import ensure_embedded_model

    yield from _engine(ensure_embedded_model())


@pytest.fixture(scope="session")
def scripted_engine_url() -> Iterator[str]:
    """The same on the scripted model (``areal.embedded.scripted``): greedy replies by contract."""
    from areal.embedded import ensure_scripted_model

    yield from _engine(ensure_scripted_model())


@pytest.fixture(scope="module")
def engine_url(model_dir: Path, request: pytest.FixtureRequest) -> Iterator[str]:
    """An embedded engine server serving ``model_dir``: the session's one on the embedded model, or
    one of the module's own on a model the module chose (a ``model_dir`` fixture of its own)."""
    from areal.embedded import ensure_embedded_model

    if Path(model_dir) == Path(ensure_embedded_model()):
        yield request.getfixturevalue("embedded_engine_url")
    else:
        yield from _engine(model_dir)


@pytest.fixture()
def gateway(engine_url: str, model_dir: Path) -> Iterator[Callable[..., Any]]:
    """``gateway(**config)``: a GatewayThread (HTTP + ZeroMQ, on uvloop; support/gateway_harness.py)
    of its own over the module's embedded engine, stopped after the test."""
    from gateway_harness import GatewayThread

    started: list[GatewayThread] = []

    def start(**config: Any) -> GatewayThread:
        started.append(GatewayThread(engine_url, model_dir, **config))
        return started[-1]

    yield start
    for gw in started:
        gw.stop()


@pytest.fixture(scope="module")
def served(engine_url: str, model_dir: Path) -> Iterator[Any]:
    """One GatewayThread over the module's embedded engine (default model), shared by the module."""
    yield from _gateway_thread(engine_url, model_dir)


@pytest.fixture(scope="module")
def served_scripted(scripted_engine_url: str) -> Iterator[Any]:
    """The same over the scripted model (``areal.embedded.scripted``): greedy replies by contract,
    for tests that need a tool call, a tool loop that ends, or a given text, on every build."""
    from areal.embedded import ensure_scripted_model

    yield from _gateway_thread(scripted_engine_url, ensure_scripted_model())
