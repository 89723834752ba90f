"""The client the runners hand an agent, made acceptable to SDKs built on ``httpx2``.

    run(data, http_client=H)        H: the httpx.AsyncClient of the runner (inline: the gateway's
      │                               HTTP door; sandboxed: sandbox.relay.ZmqTransport to its ZeroMQ door)
      ├─ openai.AsyncOpenAI(http_client=H)        takes H as it is
      └─ anthropic.AsyncAnthropic(http_client=H)  anthropic >= 2.11 is built on httpx2, a fork of httpx,
            │                                     and refuses every httpx object; given H itself it gets
            ▼                                     instead, per client it builds,
         httpx2.AsyncClient(transport=Bridge(H))  every request sent with H.send(): the same destination,
                                                  transport, connection pool and limits as H

So an agent that passes the handed client on, as AReaL's do (``AsyncAnthropic(base_url=...,
api_key=..., http_client=extra_kwargs["http_client"])``), gets a working client in both modes.

Invariants: only the clients the runners hand out (``areal.agent.spec.hand_out`` adds them to
``HANDED``; matched by identity) are replaced, so a client the agent makes itself reaches the
SDK untouched (an httpx one is refused by the SDK as before); closing the SDK's client never
closes H, which the runner owns and shares between episodes; transport errors keep their kind
(an httpx ``ReadTimeout`` reaches the SDK as httpx2's, so its timeout handling applies).
``install`` wraps ``anthropic.AsyncAnthropic.__init__`` once per process: the zygote does it
before forking, the inline runner when it starts; it also gives ``messages.create`` back the
sampling keywords anthropic 1.0 dropped (``anthropic_compat.py``).

What is covered: ``AsyncAnthropic`` and the clients it derives (``copy``, ``with_options``). Not
covered: the synchronous ``Anthropic`` (the handed client is async) and SDKs on httpx2 other
than anthropic (none is pinned). A client an agent builds itself from ``ANTHROPIC_BASE_URL`` in
a sandbox, async or sync, goes to the gateway through ``Bridge`` / ``SyncBridge`` over the
sandbox's own transports (sandbox/relay.py ``route_own_clients``).
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import weakref
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import httpx2

from areal.agent.anthropic_compat import accept_sampling_keywords

HANDED: weakref.WeakSet[httpx.AsyncClient] = weakref.WeakSet()  # the clients the runners hand agents
_installed = False


# Dropped from the response handed on: its body goes decoded (httpx has decoded it, or read it
# whole already, as for in-process transports), so httpx2 must not decode it again.
_ENCODING_HEADERS = frozenset({b"content-encoding", b"content-length"})


class _Body(httpx2.AsyncByteStream):
    """The httpx response's decoded bytes as an httpx2 stream, chunk by chunk as they arrive."""

    def __init__(self, response: httpx.Response, request: httpx2.Request) -> None:
        self._response, self._request = response, request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_bytes():
                yield chunk
        except httpx.TransportError as e:
            raise _as_httpx2(e, self._request) from e

    async def aclose(self) -> None:
        await self._response.aclose()


class Bridge(httpx2.AsyncBaseTransport):
    """An httpx2 transport that sends each request through an httpx client."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        out = httpx.Request(
            request.method,
            str(request.url),
            headers=request.headers.raw,
            content=await request.aread(),
            extensions={"timeout": request.extensions.get("timeout", {})},
        )
        try:
            response = await self.client.send(out, stream=True)
        except httpx.TransportError as e:
            raise _as_httpx2(e, request) from e
        headers = [(k, v) for k, v in response.headers.raw if k.lower() not in _ENCODING_HEADERS]
        return httpx2.Response(response.status_code, headers=headers, stream=_Body(response, request), request=request)

    # aclose: inherited, does nothing: the handed client is the runner's, not the SDK's


class _SyncBody(httpx2.SyncByteStream):
    def __init__(self, response: httpx.Response, request: httpx2.Request) -> None:
        self._response, self._request = response, request

    def __iter__(self) -> Iterator[bytes]:
        try:
            yield from self._response.iter_bytes()
        except httpx.TransportError as e:
            raise _as_httpx2(e, self._request) from e

    def close(self) -> None:
        self._response.close()


class SyncBridge(httpx2.BaseTransport):
    """``Bridge`` for sync clients: an httpx2 transport that sends each request through an httpx ``Client``."""

    def __init__(self, client: httpx.Client) -> None:
        self.client = client

    def handle_request(self, request: httpx2.Request) -> httpx2.Response:
        out = httpx.Request(
            request.method,
            str(request.url),
            headers=request.headers.raw,
            content=request.read(),
            extensions={"timeout": request.extensions.get("timeout", {})},
        )
        try:
            response = self.client.send(out, stream=True)
        except httpx.TransportError as e:
            raise _as_httpx2(e, request) from e
        headers = [(k, v) for k, v in response.headers.raw if k.lower() not in _ENCODING_HEADERS]
        return httpx2.Response(response.status_code, headers=headers, stream=_SyncBody(response, request), request=request)


def _as_httpx2(error: httpx.TransportError, request: httpx2.Request) -> httpx2.TransportError:
    """httpx2's exception of the same name (``ReadTimeout``, ``ConnectError`` ...)."""
    cls = getattr(httpx2, type(error).__name__, None)
    if not (isinstance(cls, type) and issubclass(cls, httpx2.TransportError)):
        cls = httpx2.TimeoutException if isinstance(error, httpx.TimeoutException) else httpx2.TransportError
    return cls(str(error), request=request)


def bridged(client: httpx.AsyncClient) -> httpx2.AsyncClient:
    """A new httpx2 client sending through ``client``, with its timeouts (the SDKs read them)."""
    return httpx2.AsyncClient(transport=Bridge(client), timeout=httpx2.Timeout(**client.timeout.as_dict()), trust_env=False)


def install() -> None:
    """Have ``anthropic.AsyncAnthropic`` take a handed client as its bridge (once per process; a
    no-op without anthropic, or with an anthropic still built on httpx, which takes it as it is).
    Imports nothing: with anthropic not imported yet, the wrapping happens when it is (a sandbox
    zygote holds only the SDKs of ``sandbox.preload`` and its agent's imports)."""
    global _installed
    if _installed:
        return
    _installed = True
    if "anthropic" in sys.modules:
        _wrap(sys.modules["anthropic"])
    else:
        sys.meta_path.insert(0, _WrapOnImport())


class _WrapOnImport(importlib.abc.MetaPathFinder):
    """Finds ``anthropic`` with the other finders, and wraps it once its module has run."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != "anthropic":
            return None
        sys.meta_path.remove(self)  # once: the search below, and every later import, skip this finder
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        run = spec.loader.exec_module

        def exec_module(module: Any) -> None:
            run(module)
            _wrap(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]  # this spec's loader only
        return spec


def _wrap(anthropic: Any) -> None:
    accept_sampling_keywords(anthropic)  # AReaL's agents pass temperature= and top_p= (anthropic_compat.py)
    if not issubclass(anthropic.DefaultAsyncHttpxClient, httpx2.AsyncClient):  # anthropic < 2.11: httpx
        return
    init = anthropic.AsyncAnthropic.__init__

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        client = kwargs.get("http_client")
        if client is not None and client in HANDED:
            kwargs["http_client"] = bridged(client)
        init(self, *args, **kwargs)

    anthropic.AsyncAnthropic.__init__ = __init__
