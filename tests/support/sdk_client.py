"""The official SDK clients against a gateway, in strict mode: run by whichever interpreter holds
the SDK release under test (the project's venv: the lock's; tests/support/sdk_venvs.py: the newest
of each line), so it imports nothing but ``openai``, ``anthropic`` and the standard library.

    python sdk_client.py BASE_URL KEY     ─► one JSON object: {"versions": {...}, "results": {case: ...}}

Each case makes one call through the SDK's public surface (``create``, ``stream``, the SDK's error
classes) with ``_strict_response_validation=True``, so a reply the SDK's types do not accept raises
``APIResponseValidationError`` instead of being built loosely; a case that raises reports
``{"raised": ...}``, and the rest still run. The gateway's engine is expected to answer a prompt
offering the ``calc`` tool with ``CALL`` and any other with ``TEXT``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from typing import Any

CALL = '<tool_call>\n{"name": "calc", "arguments": {"expr": "3+4"}}\n</tool_call>'
TEXT = "Seven."
QUESTION = "What is 3+4?"
CALC = {
    "name": "calc",
    "description": "Evaluate arithmetic.",
    "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]},
}


def _cases(openai: Any, anthropic: Any, oa: Any, an: Any) -> dict[str, Callable[[], Any]]:
    user = [{"role": "user", "content": QUESTION}]

    def chat_plain() -> Any:
        reply = oa.chat.completions.create(model="m", messages=user, max_tokens=16)
        return [reply.choices[0].message.content, reply.choices[0].finish_reason, reply.usage.completion_tokens > 0]

    def chat_stream() -> Any:
        chunks = list(
            oa.chat.completions.create(model="m", messages=user, max_tokens=16, stream=True, stream_options={"include_usage": True})
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        return [text, chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0]

    def chat_tools() -> Any:
        reply = oa.chat.completions.create(model="m", messages=user, max_tokens=32, tools=[{"type": "function", "function": CALC}])
        (call,) = reply.choices[0].message.tool_calls
        return [call.function.name, json.loads(call.function.arguments), reply.choices[0].finish_reason]

    def chat_refused() -> Any:
        try:
            oa.chat.completions.create(model="m", messages=[{"role": "wizard", "content": "x"}], max_tokens=16)
        except openai.BadRequestError as e:
            return [type(e).__name__, e.status_code, sorted(e.body)]
        return "accepted"

    def responses_plain() -> Any:
        reply = oa.responses.create(model="m", input=QUESTION, max_output_tokens=16)
        return [reply.output_text, reply.status]

    def responses_stream() -> Any:
        with oa.responses.stream(model="m", input=QUESTION, max_output_tokens=16) as stream:
            kinds = [event.type for event in stream]
            final = stream.get_final_response()
        return [final.output_text, kinds[0], kinds[-1]]

    def responses_tools() -> Any:
        reply = oa.responses.create(model="m", input=QUESTION, max_output_tokens=32, tools=[{"type": "function", **CALC}])
        (call,) = [item for item in reply.output if item.type == "function_call"]
        return [call.name, json.loads(call.arguments)]

    def messages_plain() -> Any:
        reply = an.messages.create(model="m", messages=user, max_tokens=16)
        return [reply.content[0].text, reply.stop_reason]

    def messages_stream() -> Any:
        with an.messages.stream(model="m", messages=user, max_tokens=16) as stream:
            text = "".join(stream.text_stream)
            final = stream.get_final_message()
        return [text, final.content[0].text, final.usage.input_tokens > 0]

    def messages_tools() -> Any:
        tools = [{"name": "calc", "description": CALC["description"], "input_schema": CALC["parameters"]}]
        reply = an.messages.create(model="m", messages=user, max_tokens=32, tools=tools)
        (use,) = [block for block in reply.content if block.type == "tool_use"]
        return [use.name, use.input, reply.stop_reason]

    def count_tokens() -> Any:
        return an.messages.count_tokens(model="m", messages=user).input_tokens > 0

    def messages_refused() -> Any:
        try:
            an.messages.create(model="m", messages=[{"role": "system", "content": "x"}], max_tokens=16)
        except anthropic.BadRequestError as e:
            return [type(e).__name__, e.status_code, e.body["error"]["type"]]
        return "accepted"

    return {
        f.__name__: f for f in (chat_plain, chat_stream, chat_tools, chat_refused, responses_plain, responses_stream, responses_tools)
    } | {f.__name__: f for f in (messages_plain, messages_stream, messages_tools, count_tokens, messages_refused)}


def main(base_url: str, key: str) -> dict:
    import anthropic
    import openai

    oa = openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0, _strict_response_validation=True)
    an = anthropic.Anthropic(base_url=base_url, api_key=key, max_retries=0, _strict_response_validation=True)
    results: dict[str, Any] = {}
    for name, case in _cases(openai, anthropic, oa, an).items():
        try:
            results[name] = case()
        except Exception as e:  # process boundary: reported to the test, which names the case
            results[name] = {"raised": f"{type(e).__module__}.{type(e).__qualname__}: {e}"[:1500]}
    return {"versions": {"openai": openai.__version__, "anthropic": anthropic.__version__}, "results": results}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
