"""The event loop this project's own processes run on: uvloop when it is installed, else asyncio's.

The controller (with the gateway in it), the engine server and the benchmark's stand-ins call
``run(main())`` instead of ``asyncio.run``. uvloop is libuv under the same asyncio API, and it
costs less per loop wake-up; a gateway call wakes the loop several times (the ZeroMQ read, the
HTTP write to the engine, its reply, the answer), so the saving adds up on every call
(``benchmarks/gateway.py`` measures the gateway's added latency; earlier figures for the two
loops are in benchmarks/README.md).

``AREAL_EVENT_LOOP=asyncio`` forces asyncio's loop (to rule uvloop out when debugging). No code
depends on which loop runs it: the tests serve the gateway on uvloop (``tests/support/gateway_harness.py``)
and run much of the rest, in-process, on asyncio's.
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


def loop_factory() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """uvloop's loop constructor, or None for asyncio's default (not installed, or opted out)."""
    choice = os.environ.get("AREAL_EVENT_LOOP", "uvloop")
    if choice not in ("uvloop", "asyncio"):
        raise ValueError(f"AREAL_EVENT_LOOP={choice!r}: expected 'uvloop' or 'asyncio'")
    if choice == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:
        return None
    return uvloop.new_event_loop


def run(main: Coroutine[Any, Any, T]) -> T:
    """``asyncio.run(main)`` on ``loop_factory()``'s loop."""
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        return runner.run(main)


async def until_signalled(main: Coroutine[Any, Any, T]) -> T:
    """Await ``main``; SIGTERM cancels it as Ctrl-C does (``asyncio.Runner``), so whatever it
    started is stopped on the way out either way (the entry points of a run and of the gateway)."""
    task = asyncio.ensure_future(main)
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
    return await task


def loop_name() -> str:
    """The running loop's kind, for logs and benchmark reports: "uvloop" or "asyncio"."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
