"""What runs in an episode process around the agent, and what the zygote prepares for it.

In a warm slot, before its spawn arrives: the relay starts (``start_relay``); then the slot
blocks on its pipe for its one SpawnEpisode (``read_spawn``) and runs the agent with its
endpoints (``run_agent``). In the zygote, before any fork: one call per SDK against an
in-process transport (``warm_up_sdks``), and the agent's own paths its episodes may read
(``agent_paths``, for the minimal root of sandbox/rootfs.py).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
from typing import TYPE_CHECKING

import msgspec

from areal.agent import AgentRun, hand_out, outcome_from_result
from areal.protocol import FRAME_HEADER, EpisodeOutcome, SpawnEpisode, ZygoteInbound

if TYPE_CHECKING:
    from sandbox.relay import Relay


def start_relay(gateway_addr: str) -> Relay:
    """In a slot, before its spawn arrives: the relay's port is bound and its thread starts,
    which sets up the HTTP server on the agent's first connection (most agents use the handed
    ``http_client`` and never connect). The relay knows no key: the agent sends its own in every
    request."""
    from sandbox.relay import Relay

    return Relay.start(gateway_addr, lazy=True)  # requests queue in the backlog until it serves


def run_agent(run: AgentRun, spawn: SpawnEpisode, gateway_addr: str, relay: Relay) -> EpisodeOutcome:
    """In the agent process, once the spawn arrived: hand run() its endpoints, await it."""
    import httpx

    from sandbox.relay import ZmqTransport

    data = json.loads(spawn.data)
    # The session in the URL as well as the key: agents that send no key, or a hard-coded
    # placeholder (LangChain examples), still reach their own session and no other.
    session_url = f"{relay.base_url}/sessions/{spawn.api_key}"
    base_url = f"{session_url}/v1"
    os.environ.update(
        OPENAI_BASE_URL=base_url, OPENAI_API_KEY=spawn.api_key, ANTHROPIC_BASE_URL=session_url, ANTHROPIC_API_KEY=spawn.api_key
    )

    async def main() -> object:
        transport = ZmqTransport(gateway_addr)
        async with hand_out(httpx.AsyncClient(transport=transport, base_url=base_url, timeout=None)) as client:
            result = run(data, base_url=base_url, api_key=spawn.api_key, http_client=client)
            return await result if inspect.isawaitable(result) else result

    return outcome_from_result(spawn.episode_id, asyncio.run(main()))


def read_spawn(fd: int) -> SpawnEpisode | None:
    """In a slot: block until the zygote hands over one SpawnEpisode frame; None at EOF."""
    buf = bytearray()
    while len(buf) < 4 or len(buf) < 4 + FRAME_HEADER.unpack_from(buf)[0]:
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return None
        buf += chunk
    msg = msgspec.msgpack.Decoder(ZygoteInbound).decode(memoryview(buf)[4:])
    if not isinstance(msg, SpawnEpisode):
        raise TypeError(f"a slot expects SpawnEpisode, got {type(msg).__name__}")
    return msg


_WARM_CHAT = {
    "id": "w",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "w"}}],
}
_WARM_MESSAGE = {
    "id": "w",
    "type": "message",
    "role": "assistant",
    "model": "m",
    "stop_reason": "end_turn",
    "content": [{"type": "text", "text": "w"}],
    "usage": {"input_tokens": 1, "output_tokens": 1},
}


def warm_up_sdks() -> None:
    """Make one call with each SDK against an in-process httpx transport, in the zygote.

    The SDKs import their resource modules and build response models on first use (~0.4 s for
    openai); paying that once here, before the fork, saves it in every episode. Anthropic's call
    goes through the httpx2 bridge, as an episode's does. No socket and no thread is created.
    """
    import httpx
    import openai

    async def calls() -> None:
        def reply(request: httpx.Request) -> httpx.Response:
            return httpx.Response(200, json=_WARM_MESSAGE if request.url.path.endswith("/messages") else _WARM_CHAT)

        # A handed client, as an episode gets: this also installs the httpx2 bridge before the fork.
        async with hand_out(httpx.AsyncClient(transport=httpx.MockTransport(reply))) as http:
            client = openai.AsyncOpenAI(base_url="http://warm/v1", api_key="warm", http_client=http)
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "w"}])
            try:
                import anthropic
            except ImportError:
                return
            claude = anthropic.AsyncAnthropic(base_url="http://warm", api_key="warm", http_client=http)
            await claude.messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "w"}])

    asyncio.run(calls())


def agent_paths(spec: str) -> list[str]:
    """What of the agent's own its episodes must read: the directory of an exec program or of a
    .py file (its helpers, a node_modules beside it), and the embedded models' cache (an agent may
    load the embedded tokenizer). A module named by import path lives on sys.path, exposed anyway."""
    from areal.agent import EXEC_PREFIX, PROJECT_ROOT
    from areal.embedded import embedded_cache_root

    out = [str(embedded_cache_root())] if embedded_cache_root().is_dir() else []
    target = spec[len(EXEC_PREFIX) :] if spec.startswith(EXEC_PREFIX) else spec.rpartition(":")[0]
    if spec.startswith(EXEC_PREFIX) or target.endswith(".py"):
        for base in (os.getcwd(), str(PROJECT_ROOT)):  # where load_agent looks, in its order
            path = os.path.join(base, target)
            if os.path.isfile(path):
                return out + [os.path.dirname(os.path.realpath(path))]
    return out
