"""The event loop of this project's own processes (``areal.aio``)."""

from __future__ import annotations

import asyncio

import pytest

from areal import aio


async def _which() -> str:
    await asyncio.sleep(0)
    return aio.loop_name()


def test_run_uses_uvloop_by_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AREAL_EVENT_LOOP", raising=False)
    assert aio.run(_which()) == "uvloop"  # uvloop is a pinned requirement: its absence is a broken install


def test_asyncio_loop_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AREAL_EVENT_LOOP", "asyncio")
    assert aio.loop_factory() is None
    assert aio.run(_which()) == "asyncio"


def test_unknown_loop_name_is_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AREAL_EVENT_LOOP", "trio")
    with pytest.raises(ValueError, match="AREAL_EVENT_LOOP='trio'"):
        aio.run(_which())


def test_run_propagates_the_coroutine_result_and_exceptions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AREAL_EVENT_LOOP", raising=False)

    async def boom() -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        aio.run(boom())
    assert aio.run(asyncio.sleep(0, result=7)) == 7
