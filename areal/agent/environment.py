"""The endpoint variables an episode's agent reads: the same values sandboxed and inline.

    OPENAI_BASE_URL     <root>/sessions/<key>/v1        OPENAI_API_KEY     <key>
    ANTHROPIC_BASE_URL  <root>/sessions/<key>           ANTHROPIC_API_KEY  <key>

``<root>`` is the gateway as the episode reaches it (the relay on the episode's own loopback in
the sandbox, sandbox/episode.py; the gateway's HTTP door inline, ``InlineRunner``), ``<key>`` the
episode's session key, in the path too, so that an agent sending a placeholder key still reaches
its own session and no other.

Sandboxed, an episode is a process of its own: the values are plain ``os.environ`` entries.
Inline, every episode runs in the controller's one process, concurrently: an ``os.environ`` entry
set per episode would be another episode's by the time an agent (or the SDK it calls) reads it.
So ``os.environ`` answers these names from a context variable (``episode_environment``): asyncio
copies the context into every task an episode starts, and ``asyncio.to_thread`` into its threads,
so the agent's code and the clients it builds from the environment (``AsyncOpenAI()``,
``AsyncAnthropic()``, LangChain's ``ChatOpenAI()``: each reads ``os.environ`` when built) see their
own episode's values. A value the same for every inline episode would not do: the gateway tells
sessions apart by the key alone, and an SDK hook would cover one SDK, where every one of them
reads ``os.environ``. Outside any episode the process's own values stand; while an inline runner
runs, the base URLs among them are its gateway without a session (``point_at``), so what the
agent runs outside its episode's context gets the gateway's 401, never another host.

What is covered: reads through ``os.environ`` and ``os.getenv`` from any module (one that did
``from os import environ`` too: the object stays the same, its class is changed, once), and the
copies made from it (``dict(os.environ)``, ``os.environ.copy()``: what an ``exec:`` agent's program
gets). What is not covered: a subprocess started without ``env=`` and a thread started without
the context (``threading.Thread``, ``loop.run_in_executor``) see the process's values (the gateway,
no session: a 401); C code calling ``getenv``. The controller's own code during an inline run
sees the process's values too: a reward function that calls a model names its endpoint itself.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar

ENDPOINT_VARIABLES = ("OPENAI_BASE_URL", "OPENAI_API_KEY", "ANTHROPIC_BASE_URL", "ANTHROPIC_API_KEY")
_BASE_URLS = ("OPENAI_BASE_URL", "ANTHROPIC_BASE_URL")

_episode: ContextVar[Mapping[str, str] | None] = ContextVar("episode_environment", default=None)


def endpoint_variables(root: str, key: str) -> dict[str, str]:
    """The four variables of the episode whose session key is ``key``, its gateway at ``root``."""
    session = f"{root}/sessions/{key}"
    return {"OPENAI_BASE_URL": f"{session}/v1", "OPENAI_API_KEY": key, "ANTHROPIC_BASE_URL": session, "ANTHROPIC_API_KEY": key}


class _EpisodeEnviron(os._Environ):
    """``os.environ``, with the current episode's variables (``_episode``) over the process's."""

    def __getitem__(self, key: str) -> str:
        values = _episode.get()
        if values is not None and key in values:
            return values[key]
        return super().__getitem__(key)

    def __iter__(self) -> Iterator[str]:
        yield from super().__iter__()
        yield from self._only_episode()

    def __len__(self) -> int:
        return super().__len__() + len(self._only_episode())

    def _only_episode(self) -> list[str]:
        values = _episode.get()
        return [k for k in values or () if self.encodekey(k) not in self._data]


def install() -> None:
    """Make ``os.environ`` answer from the current episode's variables (once per process)."""
    if type(os.environ) is os._Environ:
        os.environ.__class__ = _EpisodeEnviron


@contextlib.contextmanager
def episode_environment(values: Mapping[str, str]) -> Iterator[None]:
    """What runs inside (and every task and ``to_thread`` call it starts) reads ``values`` from
    ``os.environ`` over the process's own (``install`` first)."""
    token = _episode.set(dict(values))
    try:
        yield
    finally:
        _episode.reset(token)


def point_at(root: str) -> dict[str, str | None]:
    """Set the process's base URL variables to the gateway at ``root`` without a session; returns
    what they were, for ``restore``."""
    saved = {name: os.environ.get(name) for name in _BASE_URLS}
    os.environ.update(OPENAI_BASE_URL=f"{root}/v1", ANTHROPIC_BASE_URL=root)
    return saved


def restore(saved: Mapping[str, str | None]) -> None:
    """Put back the variables ``point_at`` replaced."""
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
