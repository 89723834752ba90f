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
import itertools
import json
import os
import sys
from typing import TYPE_CHECKING

import msgspec

from areal.agent.environment import endpoint_variables
from areal.agent.spec import AgentRun, hand_out, outcome_from_result
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


def run_agent(
    run: AgentRun, spawn: SpawnEpisode, gateway_addr: str, relay: Relay, result_fd: int = -1, world: tuple[int, int, bool] | None = None
) -> EpisodeOutcome:
    """In the agent process, once the spawn arrived: hand run() its endpoints, await it.
    ``result_fd``: the slot's result pipe, where a branch point's branches report; ``world``: a
    world episode's channel to keep each branch's workspace (its ends, and whether its task has
    a root of its own) (sandbox/branch.py)."""
    import httpx

    from sandbox import branch
    from sandbox.relay import loop_transport, route_own_clients

    branch.arm(result_fd, spawn.api_key, spawn.episode_id, relay, world)
    route_own_clients(relay.port, gateway_addr)

    data = json.loads(spawn.data)
    # The session in the URL as well as the key: agents that send no key, or a hard-coded
    # placeholder (LangChain examples), still reach their own session and no other.
    # The same variables an inline episode sees (areal/agent/environment.py), here the process's own.
    variables = endpoint_variables(relay.base_url, spawn.api_key)
    base_url = variables["OPENAI_BASE_URL"]
    os.environ.update(variables)

    async def main() -> object:
        transport = loop_transport(gateway_addr)  # shared with the clients the agent builds itself
        async with hand_out(httpx.AsyncClient(transport=transport, base_url=base_url, timeout=None)) as client:
            result = run(data, base_url=base_url, api_key=spawn.api_key, http_client=client)
            return await result if inspect.isawaitable(result) else result

    global _agent_started
    _agent_started = len(sys.modules)  # modules are appended to sys.modules in import order
    return outcome_from_result(spawn.episode_id, asyncio.run(main()))


# len(sys.modules) when this process's episode started its agent (run_agent), 0 before: what the
# agent imports after is named in its outcome (``imported_by_agent``), whether it returned or raised.
_agent_started = 0


def imported_by_agent() -> list[str]:
    """``run_time_imports`` since this process's agent started; nothing if it never did."""
    return run_time_imports(_agent_started) if _agent_started else []


def run_time_imports(held: int, limit: int = 20) -> list[str]:
    """What this episode imported that its zygote had not, as the modules to preload (at most
    ``limit``): of the modules imported since ``sys.modules`` held ``held`` of them (they are
    appended in import order), each one whose parent package was loaded before, so that a lazy
    package's submodule is named itself (``sympy.parsing``, its package ``sympy`` being preloaded
    already), and a new package once (``numpy``, not each of its modules). Preloading the names
    reported makes the episodes import none of them: the hint stops once followed."""
    new = list(itertools.islice(sys.modules, held, None))
    fresh = set(new)
    names: list[str] = []
    for name in new:
        if name.rpartition(".")[0] not in fresh and not name.startswith("_"):
            names.append(name)
            if len(names) == limit:
                break
    return names


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


_WARM_CHAT = {  # the shape of the gateway's replies (areal/gateway/chat.py): each field's type is built here, once
    "id": "w",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "finish_reason": "stop", "logprobs": None, "message": {"role": "assistant", "content": "w", "refusal": None}}],
    "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
}
_WARM_TOOL = {"type": "function", "function": {"name": "f", "description": "w", "parameters": {"type": "object", "properties": {}}}}
_WARM_TOOL_CALL = {
    **_WARM_CHAT,
    "choices": [
        {
            "index": 0,
            "finish_reason": "tool_calls",
            "logprobs": None,
            "message": {
                "role": "assistant",
                "content": None,
                "refusal": None,
                "tool_calls": [{"id": "call_w", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
            },
        }
    ],
}


def _warm_chat_stream() -> bytes:
    """A streamed chat reply as the gateway sends one: a role chunk, content, the finish, the usage."""
    head = {"id": "w", "object": "chat.completion.chunk", "created": 0, "model": "m"}
    chunks = [
        {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {"content": "w"}, "logprobs": None, "finish_reason": None}]},
        {**head, "choices": [{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}]},
        {**head, "choices": [], "usage": _WARM_CHAT["usage"]},
    ]
    return b"".join(b"data: " + json.dumps(c).encode() + b"\n\n" for c in chunks) + b"data: [DONE]\n\n"


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
    """Make the calls an episode makes, once, in the zygote: with each SDK it holds (openai,
    anthropic: ``sandbox.preload`` and the agent's own imports), through a handed client (an
    in-process transport) and through a client the SDK builds itself (its own HTTP stack, over
    loopback TCP to a throwaway HTTP server made as the relay makes its own).

    The SDKs import their resource modules and build response models on first use (~0.4 s for
    openai); an SDK's own HTTP stack imports its connection pool, TLS roots and async backend on
    its first connection (httpcore, h11, certifi, anyio); the relay's server its aiohttp parts.
    Paying that once here, before the fork, saves it in every episode (what an episode still
    imports is reported: ``run_time_imports``). Anthropic's handed call goes through the httpx2
    bridge, as an episode's does. The server's socket and the resolver's executor threads are
    gone when this returns (``asyncio.run`` shuts the executor down): the zygote forks with none.
    """
    import httpx
    from aiohttp import web

    openai, anthropic = sys.modules.get("openai"), sys.modules.get("anthropic")

    def reply_to(path: str) -> dict:
        return _WARM_MESSAGE if path.endswith("/messages") else _WARM_CHAT

    async def calls() -> None:
        def reply(request: httpx.Request) -> httpx.Response:
            asked = json.loads(request.content or b"{}")
            if request.url.path.endswith("/chat/completions") and asked.get("stream"):
                return httpx.Response(200, content=_warm_chat_stream(), headers={"content-type": "text/event-stream"})
            if request.url.path.endswith("/chat/completions") and asked.get("tools"):
                return httpx.Response(200, json=_WARM_TOOL_CALL)
            return httpx.Response(200, json=reply_to(request.url.path))

        # A handed client, as an episode gets: this also installs the httpx2 bridge before the fork.
        async with hand_out(httpx.AsyncClient(transport=httpx.MockTransport(reply))) as http:
            if openai is not None:  # a reply, a tool call, a stream with its usage: each type the SDK builds
                client = openai.AsyncOpenAI(base_url="http://warm/v1", api_key="warm", http_client=http)
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "w"}])
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "w"}], tools=[_WARM_TOOL])
                stream = await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "w"}], stream=True, stream_options={"include_usage": True}
                )
                async for _ in stream:
                    pass
            if anthropic is not None:
                claude = anthropic.AsyncAnthropic(base_url="http://warm", api_key="warm", http_client=http)
                await claude.messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "w"}])

        async def answer(request: web.Request) -> web.Response:
            await request.read()
            return web.json_response(reply_to(request.path))

        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", answer)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
        try:
            if openai is not None:
                async with openai.AsyncOpenAI(base_url=f"{url}/v1", api_key="warm", max_retries=0) as client:
                    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "w"}])
            if anthropic is not None:
                async with anthropic.AsyncAnthropic(base_url=url, api_key="warm", max_retries=0) as claude:
                    await claude.messages.create(model="m", max_tokens=1, messages=[{"role": "user", "content": "w"}])
        finally:
            await runner.cleanup()

    asyncio.run(calls())


def agent_paths(spec: str) -> list[str]:
    """What of the agent's own its episodes must read: the directory of an exec program or of a
    .py file (its helpers, a node_modules beside it), the embedded models' cache (an agent may
    load the embedded tokenizer) and a verifiers or mini-swe agent's venv. A module named by import path lives
    on sys.path, exposed anyway."""
    from areal.agent import mini_swe, verifiers_env
    from areal.agent.spec import EXEC_PREFIX, PROJECT_ROOT
    from areal.embedded import embedded_cache_root

    out = [str(embedded_cache_root())] if embedded_cache_root().is_dir() else []
    out += verifiers_env.read_paths(spec)  # a verifiers: agent's private venv (its interpreter runs in the episode)
    out += mini_swe.read_paths(spec)  # mini-swe-agent's private venv, the same way
    target = spec[len(EXEC_PREFIX) :] if spec.startswith(EXEC_PREFIX) else spec.rpartition(":")[0]
    if spec.startswith(EXEC_PREFIX) or target.endswith(".py"):
        for base in (os.getcwd(), str(PROJECT_ROOT)):  # where load_agent looks, in its order
            path = os.path.join(base, target)
            if os.path.isfile(path):
                return out + [os.path.dirname(os.path.realpath(path))]
    return out
