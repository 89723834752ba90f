"""Several servers behind one client.

``EngineRouter`` offers one engine client's interface over several base URLs (``EngineClient``
for SGLang's protocol by default; ``VLLMClient`` or any other ``InferenceEngine`` by factory):

    generate(..., session_key=K) ─► route(K): sticky server of K if it is up,
                                    else the up server with the fewest requests in flight
                                    (ties: round robin), remembered for K
         └─ EngineUnavailable ─► mark that server down, forget its keys, try the next one

Invariants:
- A session key stays on one server while that server is up, so its growing multi-turn prompt
  hits the same prefix cache. Keys without a session go to the least-loaded server.
- A server that failed to answer is skipped for ``retry_after_s``, then probed with ``/health``
  before it gets traffic again; when every server is down, all are probed once before giving up.
- Only ``EngineUnavailable`` (no answer) fails over; an HTTP error answer (``EngineError``) is the
  request's own fault and propagates. A stream fails over only before its first chunk.
- Control calls (weight updates, pause, continue, abort) go to every server, concurrently.
- A server its owner ``hold``s (``areal.engine.fleet`` restarting it) gets no traffic and no
  probe until ``release``d.

Not covered: load-aware routing by queue depth reported by the servers, cache-aware routing by
prompt prefix (SGLang's router does both).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from typing import Any

from areal.engine.client import EngineClient, EngineUnavailable, GenerateResult
from areal.engine.interface import GenerateRequest, InferenceEngine

MAX_STICKY_KEYS = 100_000


class EngineRouter(InferenceEngine):
    """One engine client's interface over several servers: sticky sessions, health failover.

    ``client(url)`` makes the client of one server (default: ``EngineClient``, SGLang's protocol);
    any ``InferenceEngine`` + ``WeightUpdatable`` with a ``base_url`` will do (``VLLMClient``)."""

    def __init__(
        self,
        base_urls: list[str],
        api_key: str | None = None,
        timeout_s: float = 600,
        retry_after_s: float = 5.0,
        *,
        client: Callable[[str], Any] | None = None,
    ) -> None:
        if not base_urls:
            raise ValueError("base_urls: at least one server is needed")
        make = client or (lambda u: EngineClient(u, api_key=api_key, timeout_s=timeout_s))
        self.clients = [make(u) for u in base_urls]
        self.retry_after_s = retry_after_s
        self._down_until = [0.0] * len(base_urls)  # monotonic time before which a server is skipped
        self._in_flight = [0] * len(base_urls)
        self._sticky: OrderedDict[str, int] = OrderedDict()
        self._next = 0
        self._held: set[int] = set()  # servers kept out of rotation by their owner (a restart in progress)

    @property
    def base_urls(self) -> list[str]:
        return [c.base_url for c in self.clients]

    def _up(self) -> list[int]:
        now = time.monotonic()
        return [i for i, t in enumerate(self._down_until) if t <= now and i not in self._held]

    def hold(self, index: int) -> None:
        """Keep server ``index`` out of rotation (its sessions move) until ``release``: its owner
        is restarting it and bringing it to the current weights."""
        self._held.add(index)
        self.mark_down(index)

    def release(self, index: int) -> None:
        self._held.discard(index)
        self._down_until[index] = 0.0

    def mark_down(self, index: int) -> None:
        self._down_until[index] = time.monotonic() + self.retry_after_s
        for key in [k for k, v in self._sticky.items() if v == index]:
            del self._sticky[key]

    async def _revive(self, only_if_none_up: bool) -> None:
        """Probe servers whose back-off expired (they are 'up' again only if /health answers)."""
        now = time.monotonic()
        candidates = [i for i, t in enumerate(self._down_until) if i not in self._held and (0 < t <= now or (only_if_none_up and t > now))]
        oks = await asyncio.gather(*(self.clients[i].health() for i in candidates))
        for i, ok in zip(candidates, oks):
            if ok:
                self._down_until[i] = 0.0
            else:
                self.mark_down(i)

    def route(self, session_key: str | None = None) -> int:
        """The index of the server for ``session_key`` (no I/O); raises if none is up."""
        up = self._up()
        if not up:
            raise EngineUnavailable(None, f"no engine is up among {self.base_urls}")
        if session_key is not None and self._sticky.get(session_key) in up:
            self._sticky.move_to_end(session_key)
            return self._sticky[session_key]
        least = min(self._in_flight[i] for i in up)
        ties = [i for i in up if self._in_flight[i] == least]
        pick = ties[self._next % len(ties)]
        self._next += 1
        if session_key is not None:
            self._sticky[session_key] = pick
            if len(self._sticky) > MAX_STICKY_KEYS:
                self._sticky.popitem(last=False)
        return pick

    async def _pick(self, session_key: str | None) -> int:
        await self._revive(only_if_none_up=not self._up())
        return self.route(session_key)

    @staticmethod
    def _call(client: Any, method: str, req: GenerateRequest) -> Any:
        """``client.generate`` or ``client.generate_stream`` for ``req``; the session stays here."""
        return getattr(client, method)(
            req.input_ids,
            req.sampling_params,
            req.return_logprob,
            req.rid,
            top_logprobs_num=req.top_logprobs_num,
            resubmit_aborted=req.resubmit_aborted,
        )

    async def _generate(self, req: GenerateRequest) -> GenerateResult:
        for _ in range(len(self.clients)):
            i = await self._pick(req.session_key)
            self._in_flight[i] += 1
            try:
                return await self._call(self.clients[i], "generate", req)
            except EngineUnavailable:
                self.mark_down(i)  # and try the next server
            finally:
                self._in_flight[i] -= 1
        raise EngineUnavailable(None, f"every engine failed: {self.base_urls}")

    async def _generate_stream(self, req: GenerateRequest) -> AsyncIterator[GenerateResult]:
        for _ in range(len(self.clients)):
            i = await self._pick(req.session_key)
            self._in_flight[i] += 1
            started = False
            try:
                # closed with this stream: a reader that stops early aborts the server's generation now
                async with contextlib.aclosing(self._call(self.clients[i], "generate_stream", req)) as chunks:
                    async for chunk in chunks:
                        started = True
                        yield chunk
                return
            except EngineUnavailable:
                self.mark_down(i)
                if started:  # the reader has tokens from this server already: no silent restart
                    raise
            finally:
                self._in_flight[i] -= 1
        raise EngineUnavailable(None, f"every engine failed: {self.base_urls}")

    async def _all(self, method: str, *args: Any, **kwargs: Any) -> list[Any]:
        return list(await asyncio.gather(*(getattr(c, method)(*args, **kwargs) for c in self.clients)))

    async def update_weights_from_disk(self, model_path: str, weight_version: str | None = None) -> None:
        await self._all("update_weights_from_disk", model_path, weight_version)

    async def pause_generation(self, mode: str = "abort") -> None:
        await self._all("pause_generation", mode)

    async def continue_generation(self) -> None:
        await self._all("continue_generation")

    async def abort_request(self, rid: str | None = None, abort_all: bool = False) -> None:
        await self._all("abort_request", rid, abort_all)

    async def health(self) -> bool:
        """True if any server is healthy; refreshes every server's up/down state."""
        oks = await self._all("health")
        for i, ok in enumerate(oks):
            if ok:
                self._down_until[i] = 0.0
            else:
                self.mark_down(i)
        return any(oks)

    async def model_info(self) -> dict:
        return await self.clients[await self._pick(None)].model_info()

    async def server_info(self) -> dict:
        return await self.clients[await self._pick(None)].server_info()

    async def close(self) -> None:
        await self._all("close")
