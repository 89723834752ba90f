"""The embedded engine as a real subprocess, driven over real HTTP by the real client.

The model is a tiny random Qwen2ForCausalLM saved with ``save_pretrained``, with a trivial
word-level tokenizer ("t<id>" per token, decoded without separators, "<eos>" special) so that ``text`` is checked too. Its eos
id is chosen as the third greedy token after PROMPT, so greedy decoding of PROMPT stops on EOS.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from engine_launchers import launch_sglang_server, sglang_command
from http_json import get, post
from tiny_models import tiny_qwen2
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from areal.engine.client import EngineClient, EngineError, EngineUnavailable
from areal.engine.launch import launch_embedded_engine
from areal.engine.router import EngineRouter
from areal.weights.disk import update_weights_from_disk_sync

VOCAB = 512
PROMPT = [5, 6, 7, 8]


def _save_tokenizer(path: Path, eos_id: int) -> None:
    vocab = {f"t{i}": i for i in range(VOCAB)}
    vocab["<eos>"] = eos_id
    del vocab[f"t{eos_id}"]
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>", unk_token="t0").save_pretrained(path)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = tiny_qwen2(vocab_size=VOCAB, initializer_range=0.2)
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        greedy = model.generate(torch.tensor([PROMPT]), max_new_tokens=3, do_sample=False, pad_token_id=0)
    eos = int(greedy[0, -1])
    assert eos not in greedy[0, len(PROMPT) : -1].tolist()
    model.config.eos_token_id = eos
    model.generation_config.eos_token_id = eos
    path = tmp_path_factory.mktemp("engine") / "model"
    model.save_pretrained(path)
    _save_tokenizer(path, eos)
    return path


@pytest.fixture(scope="module")
def hf_model(model_dir: Path) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def engine_url(model_dir: Path):
    proc = launch_embedded_engine(str(model_dir), threads=1, timeout_s=120)
    yield proc.url
    proc.stop()
    assert not proc.alive()


def generate(url: str, ids: list[int], **sp: object) -> dict:
    status, out = post(f"{url}/generate", {"input_ids": ids, "sampling_params": sp, "return_logprob": True})
    assert status == 200, out
    return out


def teacher_forced_logprobs(model: torch.nn.Module, prompt: list[int], output: list[int], temperature: float) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + output])).logits[0, len(prompt) - 1 : -1]  # (T_out, V)
    lp = torch.log_softmax(logits / (temperature if temperature > 1e-6 else 1.0), dim=-1)
    return lp.gather(1, torch.tensor(output)[:, None]).squeeze(1).tolist()


def test_greedy_matches_hf_generate_and_is_deterministic(engine_url: str, hf_model: torch.nn.Module) -> None:
    for prompt in (PROMPT, [100, 200], [3, 1, 4, 1, 5, 9, 2, 6]):
        a = generate(engine_url, prompt, temperature=0, max_new_tokens=16)
        b = generate(engine_url, prompt, temperature=0, max_new_tokens=16)
        assert a["output_ids"] == b["output_ids"]
        with torch.no_grad():
            ref = hf_model.generate(torch.tensor([prompt]), max_new_tokens=16, do_sample=False, pad_token_id=0)
        assert a["output_ids"] == ref[0, len(prompt) :].tolist()


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.3])
def test_logprobs_equal_teacher_forced_forward(engine_url: str, hf_model: torch.nn.Module, temperature: float) -> None:
    out = generate(engine_url, [11, 12, 13], temperature=temperature, max_new_tokens=24, ignore_eos=True)
    entries = out["meta_info"]["output_token_logprobs"]
    assert [e[1] for e in entries] == out["output_ids"] and all(e[2] is None for e in entries)
    ref = teacher_forced_logprobs(hf_model, [11, 12, 13], out["output_ids"], temperature)
    assert max(abs(e[0] - r) for e, r in zip(entries, ref)) < 1e-4
    assert out["meta_info"]["input_token_logprobs"] == []


def test_eos_stop_length_and_stop_token_ids(engine_url: str, model_dir: Path) -> None:
    eos = json.loads((model_dir / "config.json").read_text())["eos_token_id"]
    out = generate(engine_url, PROMPT, temperature=0, max_new_tokens=16)
    meta = out["meta_info"]
    assert out["output_ids"][-1] == eos and len(out["output_ids"]) == 3
    assert meta["finish_reason"] == {"type": "stop", "matched": eos}
    assert meta["completion_tokens"] == 3 and meta["prompt_tokens"] == len(PROMPT)
    # text: the stop token trimmed, special tokens skipped
    assert out["text"] == "".join(f"t{t}" for t in out["output_ids"][:-1])

    long = generate(engine_url, PROMPT, temperature=0, max_new_tokens=7, ignore_eos=True)
    assert long["output_ids"][:3] == out["output_ids"] and len(long["output_ids"]) == 7
    assert long["meta_info"]["finish_reason"] == {"type": "length", "length": 7}

    stop_at = long["output_ids"][4]
    first = long["output_ids"].index(stop_at)
    stopped = generate(engine_url, PROMPT, temperature=0, max_new_tokens=7, ignore_eos=True, stop_token_ids=[stop_at])
    assert stopped["output_ids"] == long["output_ids"][: first + 1]
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_at}
    assert stopped["meta_info"]["completion_tokens"] == first + 1

    zero = generate(engine_url, PROMPT, max_new_tokens=0)
    assert zero["output_ids"] == [] and zero["meta_info"]["finish_reason"] == {"type": "length", "length": 0}

    # The first token (sampled at prefill) stops it: nothing may follow it.
    head = long["output_ids"][0]
    at_once = generate(engine_url, PROMPT, temperature=0, max_new_tokens=7, ignore_eos=True, stop_token_ids=[head])
    assert at_once["output_ids"] == [head] and at_once["meta_info"]["finish_reason"] == {"type": "stop", "matched": head}


def test_batched_array_equals_single_requests(engine_url: str) -> None:
    prompts = [PROMPT, [100, 200, 300, 400, 401, 402, 403], [9]]
    status, outs = post(
        f"{engine_url}/generate",
        {
            "input_ids": prompts,
            "rid": "batch",
            "sampling_params": {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True},
            "return_logprob": True,
        },
    )
    assert status == 200 and isinstance(outs, list) and len(outs) == 3
    assert [o["meta_info"]["id"] for o in outs] == ["batch_0", "batch_1", "batch_2"]
    for prompt, batched in zip(prompts, outs):
        single = generate(engine_url, prompt, temperature=0, max_new_tokens=10, ignore_eos=True)
        assert batched["output_ids"] == single["output_ids"]
        diffs = [
            abs(a[0] - b[0]) for a, b in zip(batched["meta_info"]["output_token_logprobs"], single["meta_info"]["output_token_logprobs"])
        ]
        assert max(diffs) < 1e-4  # left padding must not change the numbers


def test_concurrent_requests_are_batched(engine_url: str) -> None:
    async def run() -> tuple[list, dict, dict]:
        client = EngineClient(engine_url)
        before = await client.server_info()
        results = await asyncio.gather(
            *(client.generate([i + 1, i + 2, i + 3], {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True}) for i in range(16))
        )
        after = await client.server_info()
        await client.close()
        return results, before, after

    results, before, after = asyncio.run(run())
    assert all(r.finish_reason == "length" and len(r.output_ids) == 16 == len(r.output_logprobs) for r in results)
    assert after["requests_served"] - before["requests_served"] == 16
    assert after["tokens_generated"] - before["tokens_generated"] == 16 * 16
    assert after["batches_run"] - before["batches_run"] < 16  # some requests shared a batch
    assert after["max_batch_size_seen"] > 1


def test_sampling_seed_reproducible_alone_and_in_a_batch(engine_url: str) -> None:
    sp = {"temperature": 1.0, "top_p": 0.9, "top_k": 50, "max_new_tokens": 20, "ignore_eos": True}
    a = generate(engine_url, PROMPT, sampling_seed=1234, **sp)
    b = generate(engine_url, PROMPT, sampling_seed=1234, **sp)
    c = generate(engine_url, PROMPT, sampling_seed=4321, **sp)
    assert a["output_ids"] == b["output_ids"] != c["output_ids"]
    status, outs = post(
        f"{engine_url}/generate",
        {"input_ids": [[400, 401], PROMPT], "sampling_params": [dict(sp, sampling_seed=7), dict(sp, sampling_seed=1234)]},
    )
    assert status == 200 and outs[1]["output_ids"] == a["output_ids"]


def test_top_k_one_is_greedy(engine_url: str) -> None:
    greedy = generate(engine_url, PROMPT, temperature=0, max_new_tokens=12, ignore_eos=True)
    top1 = generate(engine_url, PROMPT, temperature=1.0, top_k=1, max_new_tokens=12, ignore_eos=True)
    assert top1["output_ids"] == greedy["output_ids"]


def test_bad_requests_get_400(engine_url: str) -> None:
    status, out = post(f"{engine_url}/generate", {"input_ids": PROMPT, "sampling_params": {"max_tokens": 4}})
    assert status == 400 and "max_tokens" in out["error"]
    status, out = post(f"{engine_url}/generate", {"input_ids": PROMPT, "sampling_params": {"min_p": 1.5}})
    assert status == 400 and "min_p" in out["error"]
    status, out = post(f"{engine_url}/generate", {"input_ids": PROMPT, "sampling_params": {"repetition_penalty": 1.2}})
    assert status == 400 and "repetition_penalty" in out["error"]
    status, _ = post(f"{engine_url}/generate", {"input_ids": PROMPT, "sampling_params": {"n": 1, "max_new_tokens": 1}})
    assert status == 200  # an unsupported key at its SGLang default is a no-op
    status, out = post(f"{engine_url}/generate", {"input_ids": [], "sampling_params": {}})
    assert status == 400 and "empty" in out["error"]
    status, out = post(f"{engine_url}/generate", {"input_ids": PROMPT, "stream": True, "sampling_params": {"top_p": 0}})
    assert status == 400 and "top_p" in out["error"]  # validated before the stream starts
    status, out = post(f"{engine_url}/pause_generation", {"mode": "sideways"})
    assert status == 400 and "mode" in out["error"]
    status, out = post(f"{engine_url}/generate", {"input_ids": [VOCAB + 5]})
    assert status == 400 and "input_ids" in out["error"]


def test_update_weights_from_disk(engine_url: str, model_dir: Path, tmp_path: Path) -> None:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    perturbed = tmp_path / "perturbed"
    model.save_pretrained(perturbed)
    sp = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
    before = generate(engine_url, PROMPT, **sp)

    update_weights_from_disk_sync(engine_url, str(perturbed), "v1")
    after = generate(engine_url, PROMPT, **sp)
    assert after["output_ids"] != before["output_ids"]
    assert after["meta_info"]["weight_version"] == "v1"
    assert get(f"{engine_url}/get_model_info")[1]["weight_version"] == "v1"

    status, out = post(f"{engine_url}/update_weights_from_disk", {"model_path": str(tmp_path / "nope")})
    assert status == 400 and out["success"] is False and "nope" in out["message"]
    with pytest.raises(EngineError, match="nope"):
        asyncio.run(EngineClient(engine_url).update_weights_from_disk(str(tmp_path / "nope"), "v2"))
    still = generate(engine_url, PROMPT, **sp)
    assert still["output_ids"] == after["output_ids"] and still["meta_info"]["weight_version"] == "v1"

    async def restore() -> None:
        client = EngineClient(engine_url)
        await client.update_weights_from_disk(str(model_dir), "default")
        await client.close()

    asyncio.run(restore())
    assert generate(engine_url, PROMPT, **sp)["output_ids"] == before["output_ids"]


def test_health_and_model_info(engine_url: str, model_dir: Path) -> None:
    assert get(f"{engine_url}/health")[0] == 200
    assert get(f"{engine_url}/health_generate")[0] == 200
    for route in ("/get_model_info", "/model_info"):
        status, info = get(engine_url + route)
        assert status == 200 and info["model_path"] == str(model_dir) and info["is_generation"] is True
        assert info["architectures"] == ["Qwen2ForCausalLM"] and "weight_version" in info


def test_client_maps_errors() -> None:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now

    async def run() -> None:
        client = EngineClient(f"http://127.0.0.1:{port}", timeout_s=5)
        assert await client.health() is False
        with pytest.raises(EngineUnavailable):
            await client.generate(PROMPT, {"max_new_tokens": 1})
        await client.close()

    asyncio.run(run())
    with pytest.raises(EngineUnavailable):
        update_weights_from_disk_sync(f"http://127.0.0.1:{port}", "/x", None)


def test_client_generate_and_http_errors(engine_url: str, hf_model: torch.nn.Module) -> None:
    async def run() -> None:
        client = EngineClient(engine_url)
        res = await client.generate(PROMPT, {"temperature": 0.5, "max_new_tokens": 8, "ignore_eos": True}, rid="abc")
        assert res.finish_reason == "length" and res.completion_tokens == 8 and res.prompt_tokens == len(PROMPT)
        ref = teacher_forced_logprobs(hf_model, PROMPT, res.output_ids, 0.5)
        assert max(abs(a - b) for a, b in zip(res.output_logprobs, ref)) < 1e-4
        with pytest.raises(EngineError) as err:
            await client.generate(PROMPT, {"bogus": 1})
        assert err.value.status == 400 and "bogus" in err.value.message
        assert not isinstance(err.value, EngineUnavailable)
        assert (await client.model_info())["model_type"] == "qwen2"
        await client.close()

    asyncio.run(run())


def test_launch_failure_reports_log_tail(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="model_path"):
        launch_embedded_engine(str(tmp_path / "missing"), timeout_s=60)


# ------------------------------------------------------------------------------------------
# Streaming, continuous batching, pause / continue / abort, more sampling.
# ------------------------------------------------------------------------------------------

LONG = {"temperature": 1.0, "max_new_tokens": 120, "ignore_eos": True}


async def _first_chunk_then(stream, after) -> tuple[list, object]:
    """Read a stream; run ``after()`` once the first chunk is in; return (chunks, after's value)."""
    chunks, value = [], None
    async for chunk in stream:
        chunks.append(chunk)
        if len(chunks) == 1:
            value = await after()
    return chunks, value


def test_stream_final_equals_non_stream_and_chunks_are_cumulative(engine_url: str) -> None:
    async def run(n: int) -> tuple[list, object]:
        sp = dict(LONG, max_new_tokens=n, sampling_seed=99, top_k=40)
        client = EngineClient(engine_url)
        chunks = [c async for c in client.generate_stream(PROMPT, sp, top_logprobs_num=3)]
        whole = await client.generate(PROMPT, sp, top_logprobs_num=3)
        await client.close()
        return chunks, whole

    # The server sends whatever is new each time its loop wakes, so how many tokens a chunk carries
    # depends on scheduling (24 tokens have arrived in one chunk, on a loaded machine and on a fast
    # one): longer generations until something streams before the final chunk.
    for n in (24, 96, 240):
        chunks, whole = asyncio.run(run(n))
        final = chunks[-1]
        assert final.output_ids == whole.output_ids and final.output_logprobs == whole.output_logprobs
        assert final.finish_reason == whole.finish_reason == "length" and final.text == whole.text
        assert final.output_top_logprobs == whole.output_top_logprobs and len(final.output_top_logprobs) == n
        if len(chunks) >= 2:
            break
    assert len(chunks) >= 2 and all(c.finish_reason == "" for c in chunks[:-1])
    for a, b in zip(chunks, chunks[1:]):  # cumulative: every chunk extends the one before
        assert b.output_ids[: len(a.output_ids)] == a.output_ids and len(b.output_ids) >= len(a.output_ids)


def test_stream_chunks_arrive_before_generation_ends(engine_url: str) -> None:
    # The first chunk comes while the request is still running: it holds fewer tokens than the
    # last. The abort sent on it cuts the generation short, unless the rest of the generation
    # (all the context leaves: 252 tokens of a tiny model) took less than the abort's round trip,
    # which a loaded machine can make happen: then it ended at its length, whole.
    room = {**LONG, "max_new_tokens": 256 - len(PROMPT)}

    async def run() -> tuple[list, object]:
        client = EngineClient(engine_url)
        chunks, _ = await _first_chunk_then(client.generate_stream(PROMPT, room, rid="early"), lambda: client.abort_request("early"))
        await client.close()
        return chunks, None

    chunks, _ = asyncio.run(run())
    last = chunks[-1]
    assert 0 < len(chunks[0].output_ids) < len(last.output_ids)
    assert (
        (last.finish_reason, last.resubmits) == ("abort", 0)
        and len(last.output_ids) < room["max_new_tokens"]
        or (last.finish_reason == "length" and len(last.output_ids) == room["max_new_tokens"])
    ), (last.finish_reason, len(last.output_ids))
    assert len(last.output_logprobs) == len(last.output_ids)


def test_raw_sse_shape(engine_url: str) -> None:
    req = urllib.request.Request(
        f"{engine_url}/generate",
        method="POST",
        headers={"Content-Type": "application/json"},
        data=json.dumps(
            {
                "input_ids": [[1, 2], [3, 4]],
                "stream": True,
                "return_logprob": True,
                "sampling_params": {"max_new_tokens": 4, "ignore_eos": True},
            }
        ).encode(),
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.headers["Content-Type"].startswith("text/event-stream")
        events = [line for line in resp.read().decode().split("\n\n") if line]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    finals = {c["index"]: c for c in chunks if c["meta_info"]["finish_reason"] is not None}
    assert sorted(finals) == [0, 1]
    for c in finals.values():
        assert len(c["output_ids"]) == 4 == len(c["meta_info"]["output_token_logprobs"])
        assert c["meta_info"]["finish_reason"] == {"type": "length", "length": 4}


def test_new_requests_join_the_running_batch(engine_url: str) -> None:
    short_sp = {"temperature": 1.0, "max_new_tokens": 6, "ignore_eos": True, "sampling_seed": 5}

    async def run() -> tuple:
        client = EngineClient(engine_url)
        alone = await client.generate([40, 41, 42], short_sp)
        before = await client.server_info()
        order: list[str] = []

        async def short() -> object:
            res = await client.generate([40, 41, 42], short_sp)
            order.append("short")
            return res

        async def long() -> list:
            chunks, res = await _first_chunk_then(client.generate_stream(PROMPT, LONG), short)
            order.append("long")
            return [chunks, res]

        ((chunks, joined),) = await asyncio.gather(long())
        after = await client.server_info()
        await client.close()
        return alone, joined, chunks, order, before, after

    alone, joined, chunks, order, before, after = asyncio.run(run())
    assert order == ["short", "long"]  # the short request did not wait for the long batch
    assert chunks[-1].finish_reason == "length" and len(chunks[-1].output_ids) == LONG["max_new_tokens"]
    assert after["joined_running"] > before["joined_running"]
    assert joined.output_ids == alone.output_ids  # same seed, same output, whatever the batch
    assert max(abs(a - b) for a, b in zip(joined.output_logprobs, alone.output_logprobs)) < 1e-4


@pytest.mark.parametrize("mode", ["retract", "in_place"])
def test_pause_keeps_seeded_output(engine_url: str, mode: str) -> None:
    sp = dict(LONG, sampling_seed=31)

    async def run() -> tuple:
        client = EngineClient(engine_url)
        ref = await client.generate(PROMPT, sp)

        async def pause_then_continue() -> dict:
            await client.pause_generation(mode=mode)
            info = await client.server_info()
            await client.continue_generation()
            return info

        chunks, info = await _first_chunk_then(client.generate_stream(PROMPT, sp), pause_then_continue)
        await client.close()
        return ref, chunks[-1], info

    ref, final, info = asyncio.run(run())
    assert info["paused"] is True
    assert final.finish_reason == "length" and final.resubmits == 0
    assert final.output_ids == ref.output_ids  # retracted rows resume with their own generator


def test_pause_abort_resubmits_across_weight_update(engine_url: str, model_dir: Path) -> None:
    async def run() -> tuple:
        client = EngineClient(engine_url)

        async def update_while_paused() -> None:
            await client.pause_generation()  # mode abort: the running request comes back partial
            await client.update_weights_from_disk(str(model_dir), "v-resume")
            await client.continue_generation()

        chunks, _ = await _first_chunk_then(client.generate_stream(PROMPT, LONG), update_while_paused)
        await client.update_weights_from_disk(str(model_dir), "default")
        await client.close()
        return chunks

    chunks = asyncio.run(run())
    final = chunks[-1]
    assert final.finish_reason == "length" and final.resubmits == 1
    assert len(final.output_ids) == len(final.output_logprobs) == len(final.output_versions) == LONG["max_new_tokens"]
    cut = final.output_versions.index("v-resume")
    assert 0 < cut and set(final.output_versions[:cut]) == {"default"} and set(final.output_versions[cut:]) == {"v-resume"}
    assert all(b.output_ids[: len(a.output_ids)] == a.output_ids for a, b in zip(chunks, chunks[1:]))


def test_requests_wait_while_paused_and_abort_in_waiting_queue(engine_url: str) -> None:
    async def run() -> tuple:
        client = EngineClient(engine_url)
        await client.pause_generation(mode="abort")
        waiting = asyncio.create_task(client.generate(PROMPT, {"max_new_tokens": 3}, rid="queued"))
        served = asyncio.create_task(client.generate(PROMPT, {"max_new_tokens": 3, "ignore_eos": True}))
        for _ in range(600):  # bounded: until both reached the engine's waiting queue
            if (await client.server_info())["num_waiting"] == 2:
                break
            await asyncio.sleep(0.05)
        waited = not waiting.done() and not served.done()
        await client.abort_request("queued")
        aborted = await waiting
        await client.continue_generation()
        res = await served
        await client.close()
        return waited, aborted, res

    waited, aborted, res = asyncio.run(run())
    assert waited
    assert aborted.finish_reason == "abort" and aborted.output_ids == [] and aborted.resubmits == 0
    assert res.finish_reason == "length" and len(res.output_ids) == 3
    # An abort naming no request is ignored with a 200 and an empty body, as SGLang does (an empty
    # rid prefix would match every request).
    req = urllib.request.Request(f"{engine_url}/abort_request", data=b"{}", method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        assert resp.status == 200 and resp.read() == b""


def test_min_p_stop_strings_n_and_top_logprobs(engine_url: str) -> None:
    greedy = generate(engine_url, PROMPT, temperature=0, max_new_tokens=10, ignore_eos=True)
    assert (
        generate(engine_url, PROMPT, temperature=1.0, min_p=1.0, max_new_tokens=10, ignore_eos=True)["output_ids"] == greedy["output_ids"]
    )

    stop_tok = greedy["output_ids"][3]
    stop_str = f"t{stop_tok}"
    stopped = generate(engine_url, PROMPT, temperature=0, max_new_tokens=10, ignore_eos=True, stop=[stop_str, "zzz"])
    assert stopped["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop_str}
    assert stopped["output_ids"] == greedy["output_ids"][: greedy["output_ids"].index(stop_tok) + 1]
    assert stop_str not in stopped["text"] and greedy["text"].startswith(stopped["text"])

    status, outs = post(
        f"{engine_url}/generate",
        {
            "input_ids": PROMPT,
            "rid": "fan",
            "return_logprob": True,
            "top_logprobs_num": 4,
            "sampling_params": {"n": 3, "max_new_tokens": 8, "ignore_eos": True, "sampling_seed": 11},
        },
    )
    assert status == 200 and isinstance(outs, list) and len(outs) == 3
    assert [o["meta_info"]["id"] for o in outs] == ["fan_0", "fan_1", "fan_2"]
    assert len({tuple(o["output_ids"]) for o in outs}) == 3  # the copies differ
    for o in outs:
        tops = o["meta_info"]["output_top_logprobs"]
        assert len(tops) == 8 and all(len(pos) == 4 for pos in tops)
        for pos, (lp, tok, _) in zip(tops, o["meta_info"]["output_token_logprobs"]):
            assert pos[0][0] >= lp - 1e-6 and [e[0] for e in pos] == sorted((e[0] for e in pos), reverse=True)
            assert (tok not in [e[1] for e in pos]) or abs(next(e[0] for e in pos if e[1] == tok) - lp) < 1e-6


# ------------------------------------------------------------------------------------------
# Several servers.
# ------------------------------------------------------------------------------------------


def _dead_url() -> str:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()  # nothing listens there now
    return f"http://127.0.0.1:{port}"


def test_router_sticky_sessions_and_failover(engine_url: str) -> None:
    # Two names for the one live engine, so routing is observable without a second model process.
    port = engine_url.rsplit(":", 1)[1]
    live = [engine_url, f"http://localhost:{port}"]

    async def run() -> None:
        router = EngineRouter(live)
        firsts = {key: router.route(key) for key in ("a", "b", "c", "d")}
        assert set(firsts.values()) == {0, 1}  # keys spread over the servers
        for key, idx in firsts.items():
            assert all(router.route(key) == idx for _ in range(5))  # and stick
        res = await router.generate(PROMPT, {"max_new_tokens": 2}, session_key="a")
        assert len(res.output_ids) >= 1 and router.route("a") == firsts["a"]
        router.mark_down(firsts["a"])
        moved = router.route("a")
        assert moved != firsts["a"] and router.route("a") == moved
        await router.close()

        # A dead server first in line: requests fail over to the live one and it is marked down.
        router = EngineRouter([_dead_url(), engine_url], retry_after_s=60)
        out = [await router.generate(PROMPT, {"max_new_tokens": 2}, session_key=f"s{i}") for i in range(3)]
        assert all(r.finish_reason in ("stop", "length") for r in out)
        assert all(router.route(f"s{i}") == 1 for i in range(3))
        chunks = [c async for c in router.generate_stream(PROMPT, {"max_new_tokens": 3, "ignore_eos": True})]
        assert chunks[-1].finish_reason == "length"
        assert await router.health() is True and router.route() == 1
        await router.close()

        router = EngineRouter([_dead_url()], retry_after_s=60)
        with pytest.raises(EngineUnavailable):
            await router.generate(PROMPT, {"max_new_tokens": 2})
        await router.close()

    asyncio.run(run())


def test_sglang_command_construction() -> None:
    cmd = sglang_command(
        "/models/qwen",
        30000,
        tp_size=2,
        enable_metrics=True,
        disable_radix_cache=False,
        api_key=None,
        json_model_override_args='{"a": 1}',
        cuda_graph_bs=[1, 2],
    )
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    assert cmd[3:9] == ["--model-path", "/models/qwen", "--host", "127.0.0.1", "--port", "30000"]
    rest = cmd[9:]
    assert rest == ["--tp-size", "2", "--enable-metrics", "--json-model-override-args", '{"a": 1}', "--cuda-graph-bs", "1", "2"]
    if importlib.util.find_spec("sglang") is None:
        with pytest.raises(RuntimeError, match="sglang is not installed"):
            launch_sglang_server("/models/qwen", 30000)


def test_trainer_push_pauses_and_running_generations_resume_with_per_token_versions(engine_url: str, model_dir: Path) -> None:
    """The trainer's weight push: pause (abort) -> update -> continue. The running generation comes
    back partial, the client resubmits it, and each token carries the version that sampled it."""
    from areal.weights.disk import push_weights

    async def run() -> tuple:
        client = EngineClient(engine_url)
        before = (await client.server_info())["aborted"]

        async def push() -> None:
            await asyncio.to_thread(push_weights, [engine_url], model_dir, 7, 60.0, True)

        chunks, _ = await _first_chunk_then(client.generate_stream(PROMPT, LONG), push)
        after = (await client.server_info())["aborted"]
        await client.update_weights_from_disk(str(model_dir), "default")
        await client.close()
        return chunks, before, after

    chunks, before, after = asyncio.run(run())
    final = chunks[-1]
    assert final.finish_reason == "length" and final.resubmits == 1
    assert after > before
    assert len(final.output_versions) == LONG["max_new_tokens"]
    cut = final.output_versions.index("7")
    assert 0 < cut, (len(chunks[0].output_ids), final.output_versions[:5])
    assert set(final.output_versions[:cut]) == {"default"} and set(final.output_versions[cut:]) == {"7"}
