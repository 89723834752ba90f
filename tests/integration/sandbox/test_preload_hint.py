"""The preload hint (sandbox/zygote_client.py): what an episode imported at run time, named so that
listing it in ``sandbox.preload`` fixes it, for lazy packages too, and whether the episode returned
or raised.

    zygote preloads sandbox.preload ─fork─► episode imports X inside run() ─► EpisodeOutcome.imported
      ─► the run warns once: "preload it with sandbox.preload=[..., X]" ─► preloaded, no episode imports X

A real zygote forks real episodes of tests/support/sandbox_agents.py's ``lazy_import_agent``; the
gateway's socket is bound (the sandbox binds it into each episode) but never called: these
agents make no model call. ``lazy_package`` (tests/support) imports its ``part`` only when asked.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
import zmq
from zygote_harness import zygote_env

from areal.protocol import EpisodeOutcome
from sandbox.isolation import SandboxConfig
from sandbox.zygote_client import Zygote

KEY = "sk-session-preload-hint"


@pytest.fixture
def gateway_addr(tmp_path: Path) -> Iterator[str]:
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    addr = f"ipc://{tmp_path}/gateway.sock"
    sock.bind(addr)
    try:
        yield addr
    finally:
        sock.close(0)
        ctx.term()


def _episodes(addr: str, log_dir: Path, preload: list[str], rows: list[dict], warned: list[str]) -> list[EpisodeOutcome]:
    async def go() -> list[EpisodeOutcome]:
        with zygote_env():
            zygote = await Zygote.start("sandbox_agents:lazy_import_agent", addr, SandboxConfig(preload=preload), str(log_dir))
        zygote.on_warning = warned.append
        try:
            return [await zygote.run_episode(f"e{i}", row, KEY) for i, row in enumerate(rows)]
        finally:
            await zygote.close()

    return asyncio.run(go())


def test_a_lazy_packages_part_is_named_itself_and_the_hint_stops_once_followed(gateway_addr, tmp_path):
    warned: list[str] = []
    rows = [{"module": "lazy_package.part"}] * 2
    lazy = _episodes(gateway_addr, tmp_path, ["openai", "lazy_package"], rows, warned)
    # the package itself is preloaded: naming it (as a top-level name would) fixes nothing
    assert [(o.status, o.imported) for o in lazy] == [("ok", ["lazy_package.part"])] * 2
    assert len(warned) == 1 and "sandbox.preload=[openai,lazy_package,lazy_package.part]" in warned[0], warned
    followed = _episodes(gateway_addr, tmp_path, ["openai", "lazy_package", "lazy_package.part"], rows, warned)
    assert [(o.status, o.imported) for o in followed] == [("ok", [])] * 2
    assert len(warned) == 1, warned


def test_an_episode_that_fails_names_its_imports_too(gateway_addr, tmp_path):
    warned: list[str] = []
    (out,) = _episodes(gateway_addr, tmp_path, ["openai"], [{"module": "lazy_package.part", "fail": True}], warned)
    assert out.status == "error" and "the agent failed after its import" in out.error, out.error
    assert out.imported == ["lazy_package"]  # a package new to the episode is named once, not module by module
    assert len(warned) == 1 and "sandbox.preload=[openai,lazy_package]" in warned[0], warned
