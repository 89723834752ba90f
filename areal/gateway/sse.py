"""Server-sent events as the Messages and Responses APIs stream them: events named by their type.

    core ─ChoiceDelta stream─► relay_events ─► ChoiceEvents (anthropic.MessageEvents,
                                               responses.ResponseEvents) ─► SSE frames

Invariant: the frames of one choice are the API's start events, each delta's events, then the
done delta's finish events; an engine failure midway ends them with the API's error event (the
HTTP status was already sent).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Protocol

from areal.engine.client import EngineError
from areal.gateway.contract import Choice, ChoiceDelta


def sse_event(event: dict) -> bytes:
    """One SSE event named by its ``type`` (the Messages and Responses APIs' framing)."""
    return f"event: {event['type']}\ndata: {json.dumps(event, separators=(',', ':'))}\n\n".encode()


class ChoiceEvents(Protocol):
    """One API's event sequence for a streamed choice (its SSE frames, already encoded)."""

    def start(self) -> list[bytes]: ...

    def delta(self, kind: str, text: str) -> list[bytes]: ...

    def finish(self, choice: Choice) -> list[bytes]: ...

    def error(self, error: EngineError) -> bytes: ...


async def relay_events(events: ChoiceEvents, first: ChoiceDelta, rest: AsyncIterator[ChoiceDelta]) -> AsyncIterator[bytes]:
    """The SSE frames of one streamed choice: ``events.start()``, then each delta's, then the
    done delta's ``finish``; the engine failing midway, ``events.error``."""
    for frame in events.start():
        yield frame
    delta: ChoiceDelta | None = first
    try:
        while delta is not None:
            if delta.kind == "done":
                assert delta.choice is not None, "a done delta carries its choice"
                for frame in events.finish(delta.choice):
                    yield frame
                return
            for frame in events.delta(delta.kind, delta.text):
                yield frame
            delta = await anext(rest, None)
    except EngineError as e:
        yield events.error(e)
