"""``top_k``, ``min_p`` and ``repetition_penalty`` (SGLang's and vLLM's extensions of the OpenAI
APIs, sent by the SDKs as ``extra_body``) reach the engine from all three APIs; bad values are a
400 naming the parameter. The engine's own validation answers for what it cannot do."""

from __future__ import annotations

import httpx
import pytest

MESSAGES = [{"role": "user", "content": "What is 6 times 7?"}]


def _post(gw, path: str, body: dict) -> httpx.Response:
    key = gw.open_session()
    return httpx.post(gw.http + path, json=body, headers={"Authorization": f"Bearer {key}", "x-api-key": key}, timeout=60)


BODIES = {
    "/v1/chat/completions": {"model": "m", "messages": MESSAGES, "max_tokens": 8},
    "/v1/responses": {"model": "m", "input": "What is 6 times 7?", "max_output_tokens": 8},
    "/v1/messages": {"model": "m", "messages": MESSAGES, "max_tokens": 8},
}


@pytest.mark.parametrize("path", list(BODIES))
def test_top_k_and_min_p_are_accepted_by_every_api(served_scripted, path):
    r = _post(served_scripted, path, {**BODIES[path], "top_k": 1, "min_p": 0.05})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("path", list(BODIES))
@pytest.mark.parametrize("param,bad", [("top_k", 0), ("min_p", 1.5), ("repetition_penalty", -1.0)])
def test_bad_sampling_extensions_are_a_400_naming_them(served_scripted, path, param, bad):
    r = _post(served_scripted, path, {**BODIES[path], param: bad})
    assert r.status_code == 400, r.text
    assert param in r.text


class RecordingEngine:
    """Records the sampling params each call sends (an engine-side view of what the gateway asked)."""

    def __init__(self, eot: int) -> None:
        self.eot, self.params = eot, []

    async def generate(self, input_ids, sampling_params, return_logprob=True, rid=None, **kw):
        from areal.engine.client import GenerateResult

        self.params.append(dict(sampling_params))
        return GenerateResult(
            output_ids=[self.eot],
            output_logprobs=[-0.1],
            finish_reason="stop",
            weight_version="0",
            prompt_tokens=len(input_ids),
            completion_tokens=1,
        )


@pytest.mark.parametrize("path", list(BODIES))
def test_the_engine_receives_them_and_nothing_when_unset(path):
    import asyncio
    import json

    from qwen_tokenizers import build_qwen25_tokenizer

    from areal.gateway import Gateway, GatewayConfig
    from areal.gateway.server import handle
    from areal.protocol import GatewayRequest

    tok = build_qwen25_tokenizer()
    engine = RecordingEngine(tok.convert_tokens_to_ids("<|im_end|>"))

    async def post(body: dict) -> int:
        gw = Gateway(engine, tok, GatewayConfig())
        key = gw.open_session("e")
        req = GatewayRequest(
            request_id=1,
            method="POST",
            path=path,
            body=json.dumps(body).encode(),
            headers={"authorization": f"Bearer {key}", "x-api-key": key},
        )
        return (await handle(gw, req)).status

    assert asyncio.run(post({**BODIES[path], "top_k": 5, "min_p": 0.1, "repetition_penalty": 1.1})) == 200
    assert asyncio.run(post(BODIES[path])) == 200
    sent, plain = engine.params
    assert (sent["top_k"], sent["min_p"], sent["repetition_penalty"]) == (5, 0.1, 1.1)
    assert not {"top_k", "min_p", "repetition_penalty"} & set(plain)
