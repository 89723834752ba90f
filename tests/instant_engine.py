"""A stand-in engine for tests whose engine must answer at once, not well: SGLang's ``/generate``
on loopback, always sampling ``answer`` then ``<|im_end|>``. For sandbox tests, where the attack
or the scan is the subject and a real model would only add seconds."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web


async def start_instant_engine(tok: Any, answer: str = "42", on_call: Callable[[], Awaitable[None] | None] | None = None) -> web.AppRunner:
    """Serve on a free loopback port (``runner.addresses[0][1]``); ``on_call`` runs per request,
    before the reply (awaited if it is a coroutine function: a test may hold the reply)."""
    output_ids = tok.encode(answer, add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]

    async def generate(request: web.Request) -> web.Response:
        body = await request.json()
        if on_call is not None and inspect.isawaitable(held := on_call()):
            await held
        return web.json_response(
            {
                "text": answer,
                "output_ids": output_ids,
                "meta_info": {
                    "finish_reason": {"type": "stop"},
                    "prompt_tokens": len(body["input_ids"]),
                    "completion_tokens": len(output_ids),
                    "weight_version": "0",
                    "output_token_logprobs": [[-0.5, t, None] for t in output_ids],
                },
            }
        )

    app = web.Application()
    app.router.add_post("/generate", generate)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    return runner
