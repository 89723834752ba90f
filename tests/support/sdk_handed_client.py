"""The async SDK clients built on the client a runner hands an agent (an ``httpx.AsyncClient``),
as AReaL's agents build them, in strict mode: run by the interpreter holding the SDK release under
test, with the project on ``sys.path`` for ``areal.agent.httpx2_bridge`` (which needs only httpx and
httpx2), so that anthropic >= 2.11, built on httpx2, gets the bridge (openai, 3.x too, takes an
httpx client as it is).

    python sdk_handed_client.py BASE_URL KEY   ─► one JSON object: {case: what the call returned, or "raised"}
"""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any


async def main(base_url: str, key: str) -> dict[str, Any]:
    import anthropic
    import httpx
    import openai

    from areal.agent import httpx2_bridge

    httpx2_bridge.install()  # as the zygote and the inline runner do, before the agent runs
    user = [{"role": "user", "content": "What is 3+4?"}]
    results: dict[str, Any] = {}
    async with httpx.AsyncClient(timeout=60) as handed:
        httpx2_bridge.HANDED.add(handed)  # as areal.agent.spec.hand_out does
        oa = openai.AsyncOpenAI(base_url=f"{base_url}/v1", api_key=key, http_client=handed, max_retries=0, _strict_response_validation=True)
        an = anthropic.AsyncAnthropic(base_url=base_url, api_key=key, http_client=handed, max_retries=0, _strict_response_validation=True)

        async def chat() -> Any:
            reply = await oa.chat.completions.create(model="m", messages=user, max_tokens=16)
            return reply.choices[0].message.content

        async def chat_stream() -> Any:
            stream = await oa.chat.completions.create(model="m", messages=user, max_tokens=16, stream=True)
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        async def responses() -> Any:
            return (await oa.responses.create(model="m", input="What is 3+4?", max_output_tokens=16)).output_text

        async def messages() -> Any:
            return (await an.messages.create(model="m", messages=user, max_tokens=16)).content[0].text

        for case in (chat, chat_stream, responses, messages):
            try:
                results[case.__name__] = await case()
            except Exception as e:  # process boundary: reported to the test, which names the case
                results[case.__name__] = {"raised": f"{type(e).__module__}.{type(e).__qualname__}: {e}"[:1500]}
    return results


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(sys.argv[1], sys.argv[2]))))
