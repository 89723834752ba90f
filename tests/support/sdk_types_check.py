"""The installed SDKs' own types, strict, over replies the gateway gave: run by whichever interpreter
holds the SDK release under test (tests/support/sdk_venvs.py), so it imports nothing but
``openai``, ``anthropic``, pydantic and the standard library.

    python sdk_types_check.py < [[api, streamed, payload], ...]   ─► [[index, what the type refused], ...]

``api`` is "chat", "responses" or "anthropic"; ``streamed`` says whether the payload is a stream
event (a chunk) or a whole reply. An empty list: every payload validates.
"""

from __future__ import annotations

import json
import sys


def sdk_types() -> dict:
    """(api, streamed) -> a TypeAdapter of the installed SDK's type of that payload."""
    from anthropic.types import Message, RawMessageStreamEvent
    from openai.types.chat import ChatCompletion, ChatCompletionChunk
    from openai.types.responses import Response, ResponseStreamEvent
    from pydantic import TypeAdapter

    return {
        ("chat", False): TypeAdapter(ChatCompletion),
        ("chat", True): TypeAdapter(ChatCompletionChunk),
        ("responses", False): TypeAdapter(Response),
        ("responses", True): TypeAdapter(ResponseStreamEvent),
        ("anthropic", False): TypeAdapter(Message),
        ("anthropic", True): TypeAdapter(RawMessageStreamEvent),
    }


def main(items: list) -> list:
    from pydantic import ValidationError

    types = sdk_types()
    refused = []
    for i, (api, streamed, payload) in enumerate(items):
        try:
            types[api, streamed].validate_python(payload, strict=True)
        except ValidationError as e:
            refused.append([i, str(e)[:1500]])
    return refused


if __name__ == "__main__":
    print(json.dumps(main(json.load(sys.stdin))))
