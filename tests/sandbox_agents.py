"""Agents used by tests/test_sandbox.py. Each case is one behaviour (or one escape attempt).

``ProbeAgent.run`` dispatches on ``data["case"]`` so that one zygote serves every test.
"""

from __future__ import annotations

import asyncio
import importlib
import ctypes
import os
import socket
import subprocess
import time
from typing import Any

import openai


class ProbeAgent:
    async def run(self, data: dict, **kw: Any) -> float | dict[str, float]:
        return await getattr(self, data["case"])(data, **kw)

    async def reward(self, data: dict, **kw: Any) -> float:
        print("agent stdout line")  # must land in the episode log, not on the control channel
        return float(data["value"])

    async def rewards(self, data: dict, **kw: Any) -> dict[str, float]:
        return {"a": 1.0, "b": 0.25}

    async def lazy_import(self, data: dict, **kw: Any) -> float:
        # Imported only now, after the fork and the private /tmp: the module must stay reachable.
        return float(importlib.import_module(data["module"]).VALUE)

    async def write_file(self, data: dict, **kw: Any) -> float:
        with open(data["path"], "w") as f:
            f.write("escape")
        return 1.0

    async def raises(self, data: dict, **kw: Any) -> float:
        raise ValueError("agent failed on purpose " + data["tag"])

    async def sleep_forever(self, data: dict, **kw: Any) -> float:
        # Escape attempt: a grandchild in its own session outlives the process group kill unless
        # the PID namespace takes it down.
        subprocess.Popen(["sleep", data["marker"]], start_new_session=True)
        await asyncio.sleep(3600)
        return 0.0

    async def block_loop(self, data: dict, **kw: Any) -> float:
        time.sleep(3600)  # blocks the event loop itself; only the deadline can end this
        return 0.0

    async def segfault(self, data: dict, **kw: Any) -> float:
        ctypes.string_at(0)  # a real SIGSEGV (kill() to PID 1 from inside its namespace is ignored)
        return 0.0

    async def openai_env(self, data: dict, **kw: Any) -> dict[str, float]:
        client = openai.AsyncOpenAI()  # OPENAI_BASE_URL / OPENAI_API_KEY from the environment
        return await _chat(client, data)

    async def openai_http_client(self, data: dict, *, base_url: str, api_key: str, http_client: Any,
                                 **kw: Any) -> dict[str, float]:
        client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client)
        return await _chat(client, data)

    async def openai_stream(self, data: dict, *, base_url: str, api_key: str, http_client: Any,
                            **kw: Any) -> dict[str, float]:
        out = {}
        for label, client in (("relay", openai.AsyncOpenAI()),
                              ("zmq", openai.AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client))):
            stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                          stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream])
            out[label] = float(text == data["expect"])
        return out

    async def connect_host(self, data: dict, **kw: Any) -> float:
        # Escape attempt: reach a TCP listener on the host's loopback.
        try:
            socket.create_connection(("127.0.0.1", data["port"]), timeout=3).close()
        except OSError:
            return 0.0
        return 1.0

    async def environment(self, data: dict, **kw: Any) -> dict[str, float]:
        return {name: 1.0 for name in os.environ}

    async def identity(self, data: dict, **kw: Any) -> dict[str, float]:
        visible = [p for p in os.listdir("/proc") if p.isdigit()]
        return {"pid": float(os.getpid()), "visible_pids": float(len(visible)),
                "host_file_visible": float(os.path.exists(data["host_file"])),
                "tmp_writable": float(_write_tmp())}

    async def remount(self, data: dict, **kw: Any) -> float:
        # Escape attempt: root in the sandbox tries to undo the private /tmp.
        libc = ctypes.CDLL(None, use_errno=True)
        return float(libc.umount2(b"/tmp", 2) == 0)  # MNT_DETACH

    async def allocate(self, data: dict, **kw: Any) -> float:
        blocks = [bytearray(1 << 20) for _ in range(data["mib"])]  # touched pages count
        return float(len(blocks))


def _write_tmp() -> bool:
    with open(os.path.join(os.environ["TMPDIR"], "x"), "w") as f:
        f.write("ok")
    return True


async def _chat(client: openai.AsyncOpenAI, data: dict) -> dict[str, float]:
    reply = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    return {"matched": float(reply.choices[0].message.content == data["expect"])}


async def function_agent(data: dict, **kw: Any) -> float:
    """A plain async function as the agent."""
    return 2.5
