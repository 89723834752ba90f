"""SGLang native HTTP protocol conformance, over raw HTTP (the shapes SGLang's own server answers with).

Runs against the embedded engine (a tiny random Qwen2 model built here) by default, and unchanged
against a real SGLang server when ``AREAL_SGLANG_URL`` is set (e.g. on a GPU machine:
``AREAL_SGLANG_URL=http://127.0.0.1:30000 pytest tests/integration/sglang/test_sglang_protocol.py``). Checks that
depend on the embedded engine's internals are marked ``embedded_only`` and skipped there.
Prompts use small token ids so that they are valid in any vocabulary.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import aiohttp
import pytest
from tiny_models import tiny_qwen2

from areal.engine.launch import launch_embedded_engine

SGLANG_URL = os.environ.get("AREAL_SGLANG_URL")
embedded_only = pytest.mark.skipif(SGLANG_URL is not None, reason="embedded engine only")
PROMPT = [11, 12, 13, 14]
LONG = {"temperature": 1.0, "max_new_tokens": 200, "ignore_eos": True}


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory):
    if SGLANG_URL:
        yield SGLANG_URL.rstrip("/")
        return
    path = tmp_path_factory.mktemp("proto") / "model"
    tiny_qwen2(vocab_size=256, hidden_size=32, max_position_embeddings=512, eos_token_id=255).save_pretrained(path)
    proc = launch_embedded_engine(str(path), timeout_s=120)
    yield proc.url
    proc.stop()


def call(url: str, method: str, route: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(url + route, data=data, method=method, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            payload = resp.read()
            status = resp.status
    except urllib.error.HTTPError as exc:
        payload, status = exc.read(), exc.code
    try:
        return status, json.loads(payload) if payload else None
    except ValueError:
        return status, payload.decode()


def error_text(body: Any) -> str:
    """Any of SGLang's three error shapes, as text."""
    err = body.get("error", body) if isinstance(body, dict) else body
    return str(err.get("message", err) if isinstance(err, dict) else err)


def check_meta(out: dict, prompt_len: int, logprobs: bool) -> None:
    assert isinstance(out["text"], str) and all(isinstance(t, int) for t in out["output_ids"])
    meta = out["meta_info"]
    assert isinstance(meta["id"], str) and isinstance(meta["weight_version"], str)
    assert meta["prompt_tokens"] == prompt_len and meta["completion_tokens"] == len(out["output_ids"])
    assert meta["finish_reason"]["type"] in ("stop", "length", "abort")
    if logprobs:
        entries = meta["output_token_logprobs"]
        assert [e[1] for e in entries] == out["output_ids"]
        assert all(len(e) == 3 and isinstance(e[0], float) and e[0] <= 0 for e in entries)


async def read_stream(url: str, body: dict, on_first: Any = None) -> list[dict]:
    """POST a streaming /generate; returns the parsed chunks; asserts the SSE framing."""
    chunks: list[dict] = []
    async with aiohttp.ClientSession() as session:
        async with session.post(url + "/generate", json=dict(body, stream=True)) as resp:
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/event-stream")
            lines = []
            async for line in resp.content:
                if not line.strip():
                    continue
                lines.append(line.decode().strip())
                assert lines[-1].startswith("data: ")
                if lines[-1] != "data: [DONE]":
                    chunks.append(json.loads(lines[-1][6:]))
                    if len(chunks) == 1 and on_first is not None:
                        await on_first()
            assert lines[-1] == "data: [DONE]"
    return chunks


def test_generate_shapes_single_and_batch(url: str) -> None:
    status, out = call(
        url,
        "POST",
        "/generate",
        {"input_ids": PROMPT, "return_logprob": True, "sampling_params": {"max_new_tokens": 5, "ignore_eos": True}},
    )
    assert status == 200
    check_meta(out, len(PROMPT), logprobs=True)
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 5}
    assert out["meta_info"]["input_token_logprobs"] == []

    status, outs = call(url, "POST", "/generate", {"input_ids": [PROMPT, [1, 2]], "rid": "pb", "sampling_params": {"max_new_tokens": 3}})
    assert status == 200 and isinstance(outs, list) and len(outs) == 2
    assert [o["meta_info"]["id"] for o in outs] == ["pb_0", "pb_1"]
    for o, p in zip(outs, [PROMPT, [1, 2]]):
        check_meta(o, len(p), logprobs=False)


def test_top_logprobs_and_n(url: str) -> None:
    status, out = call(
        url,
        "POST",
        "/generate",
        {"input_ids": PROMPT, "return_logprob": True, "top_logprobs_num": 3, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}},
    )
    assert status == 200
    tops = out["meta_info"]["output_top_logprobs"]
    assert len(tops) == 4 and all(len(pos) == 3 and len(pos[0]) == 3 for pos in tops)
    status, outs = call(
        url, "POST", "/generate", {"input_ids": PROMPT, "sampling_params": {"n": 2, "max_new_tokens": 3, "ignore_eos": True}}
    )
    assert status == 200 and isinstance(outs, list) and len(outs) == 2


def test_stream_is_cumulative_and_matches_non_stream(url: str) -> None:
    # A server sends what it has when it gets to it: a short generation on a fast machine may end
    # before the first chunk goes out (one chunk, final). Longer ones until a stream has several.
    for max_new_tokens in (12, 64, 256):
        body = {
            "input_ids": PROMPT,
            "return_logprob": True,
            "sampling_params": {"temperature": 0, "max_new_tokens": max_new_tokens, "ignore_eos": True},
        }
        chunks = asyncio.run(read_stream(url, body))
        if len(chunks) >= 2:
            break
    status, whole = call(url, "POST", "/generate", body)
    assert status == 200 and len(chunks) >= 2
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])
    for a, b in zip(chunks, chunks[1:]):
        assert b["output_ids"][: len(a["output_ids"])] == a["output_ids"]
        assert len(a["meta_info"]["output_token_logprobs"]) == len(a["output_ids"])
    assert chunks[-1]["output_ids"] == whole["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"] == whole["meta_info"]["finish_reason"]


def test_errors(url: str) -> None:
    status, out = call(url, "POST", "/generate", {"input_ids": PROMPT, "sampling_params": {"max_tokens": 3}})
    assert status == 400 and "max_tokens" in error_text(out)
    status, out = call(url, "POST", "/generate", {"input_ids": [], "sampling_params": {}})
    assert status == 400 and "empty" in error_text(out)
    status, out = call(url, "POST", "/pause_generation", raw=b"")
    assert status == 400  # a JSON body is required
    status, out = call(url, "POST", "/update_weights_from_disk", {"model_path": "/nonexistent/model"})
    assert status == 400 and out["success"] is False


def test_health_and_model_info(url: str) -> None:
    assert call(url, "GET", "/health")[0] == 200
    assert call(url, "GET", "/health_generate")[0] == 200
    status, info = call(url, "GET", "/get_model_info")
    assert status == 200 and info["is_generation"] is True
    for key in ("model_path", "served_model_name", "tokenizer_path", "weight_version", "preferred_sampling_params"):
        assert key in info


def _caught_mid_flight(generate: Any, after_miss: Any = None, attempts: int = 5) -> list[dict]:
    """The chunks of the first of ``attempts`` generations that an abort caught before its end. A
    generation may end before the abort (sent on its first chunk) lands, on a loaded machine: that
    one must have run to its full length (``after_miss`` then undoes what the abort left)."""
    for _ in range(attempts):
        chunks = generate()
        if chunks[-1]["meta_info"]["finish_reason"]["type"] == "abort":
            return chunks
        assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
        assert len(chunks[-1]["output_ids"]) == LONG["max_new_tokens"]
        if after_miss is not None:
            after_miss()
    raise AssertionError(f"no generation of {LONG['max_new_tokens']} tokens was caught by an abort in {attempts} tries")


def test_abort_request_returns_partial_tokens(url: str) -> None:
    async def run() -> list[dict]:
        return await read_stream(
            url,
            {"input_ids": PROMPT, "rid": "proto-abort", "return_logprob": True, "sampling_params": LONG},
            on_first=lambda: asyncio.to_thread(call, url, "POST", "/abort_request", {"rid": "proto-abort"}),
        )

    final = _caught_mid_flight(lambda: asyncio.run(run()))[-1]
    assert final["meta_info"]["finish_reason"]["type"] == "abort"
    assert 0 < len(final["output_ids"]) < LONG["max_new_tokens"]
    assert len(final["meta_info"]["output_token_logprobs"]) == len(final["output_ids"])


def test_pause_abort_and_continue(url: str) -> None:
    async def pause() -> None:
        status, out = await asyncio.to_thread(call, url, "POST", "/pause_generation", {"mode": "abort"})
        assert status == 200 and out == {"message": "Generation paused successfully.", "status": "ok"}

    def resume() -> None:
        assert call(url, "POST", "/continue_generation", {})[0] == 200

    chunks = _caught_mid_flight(
        lambda: asyncio.run(read_stream(url, {"input_ids": PROMPT, "sampling_params": LONG}, on_first=pause)), resume
    )
    reason = chunks[-1]["meta_info"]["finish_reason"]
    assert reason["type"] == "abort" and reason.get("status_code") is None
    assert len(chunks[-1]["output_ids"]) < LONG["max_new_tokens"]
    status, out = call(url, "POST", "/continue_generation", {})
    assert status == 200 and out == {"message": "Generation continued successfully.", "status": "ok"}
    assert call(url, "POST", "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}})[0] == 200


@embedded_only
def test_request_sent_while_paused_waits_for_continue(url: str) -> None:
    async def run() -> tuple[bool, int]:
        await asyncio.to_thread(call, url, "POST", "/pause_generation", {"mode": "in_place"})
        task = asyncio.create_task(
            asyncio.to_thread(call, url, "POST", "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}})
        )
        for _ in range(600):
            if (await asyncio.to_thread(call, url, "GET", "/get_server_info"))[1]["num_waiting"] == 1:
                break
            await asyncio.sleep(0.05)
        blocked = not task.done()
        await asyncio.to_thread(call, url, "POST", "/continue_generation", {})
        status, _ = await task
        return blocked, status

    blocked, status = asyncio.run(run())
    assert blocked and status == 200


def test_update_weights_from_disk_sets_version(url: str) -> None:
    model_path = call(url, "GET", "/get_model_info")[1]["model_path"]
    status, out = call(url, "POST", "/update_weights_from_disk", {"model_path": model_path, "weight_version": "proto-v1"})
    assert status == 200 and out["success"] is True and "num_paused_requests" in out
    status, gen = call(url, "POST", "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 1}})
    assert gen["meta_info"]["weight_version"] == "proto-v1"
    assert call(url, "GET", "/get_model_info")[1]["weight_version"] == "proto-v1"
    call(url, "POST", "/update_weights_from_disk", {"model_path": model_path, "weight_version": "default"})


def test_distributed_update_runs_inside_a_weight_update_session(url: str) -> None:
    """SGLang 0.5.23 refuses /update_weights_from_distributed outside /begin_weight_update ...
    /end_weight_update (CollectiveWeightPush opens one around each push)."""
    update = {"names": [], "dtypes": [], "shapes": []}
    status, out = call(url, "POST", "/update_weights_from_distributed", update)
    assert status == 400 and out["success"] is False and "begin_weight_update" in out["message"]
    assert call(url, "POST", "/end_weight_update", {})[0] == 400  # none is open
    assert call(url, "POST", "/begin_weight_update", {}) == (200, {"success": True, "message": "Success"})
    assert call(url, "POST", "/begin_weight_update", {})[0] == 400  # one at a time
    assert call(url, "POST", "/end_weight_update", {}) == (200, {"success": True, "message": "Success"})


def test_context_overflow_zero_budget_and_final_meta(url: str) -> None:
    """SGLang refuses prompt + max_new_tokens beyond the context (no silent clamp), answers
    max_new_tokens=0 with no tokens, and puts its extra meta_info keys on a final answer."""
    status, out = call(url, "POST", "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 10**7}})
    assert status == 400 and "maximum context length" in error_text(out)
    status, out = call(url, "POST", "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 0}})
    assert status == 200 and out["output_ids"] == [] and out["meta_info"]["finish_reason"] == {"type": "length", "length": 0}
    status, out = call(url, "POST", "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}})
    meta = out["meta_info"]
    assert status == 200 and meta["num_retractions"] == 0 and meta["reasoning_tokens"] == 0
    assert meta["weight_versions"] == [{"version": meta["weight_version"], "start": 0, "end": 3}]


def test_abort_request_without_a_rid_is_ignored(url: str) -> None:
    assert call(url, "POST", "/abort_request", {})[0] == 200
    assert call(url, "POST", "/abort_request", {"rid": ""})[0] == 200


@embedded_only
def test_a_client_that_hangs_up_has_its_rows_aborted(url: str) -> None:
    """As SGLang: a non-streamed /generate whose client hangs up is aborted (its row leaves the
    engine, counted in ``aborted``), and the request beside it is still served. The engine is
    paused in place meanwhile, so both rows wait in its queue whatever it would sample."""

    def info() -> dict:
        """The engine's counters; ``held``: rows it took in and has not finished."""
        counters = call(url, "GET", "/get_server_info")[1]
        return {**counters, "held": counters["requests_received"] - counters["requests_served"]}

    def until(condition: Callable[[dict], bool], what: str) -> None:
        for _ in range(600):  # bounded: an engine that never does it fails here
            if condition(info()):
                return
            time.sleep(0.05)
        raise AssertionError(f"never: {what}")

    before = info()
    body = json.dumps({"input_ids": PROMPT, "sampling_params": LONG}).encode()
    host, port = url.removeprefix("http://").split(":")
    call(url, "POST", "/pause_generation", {"mode": "in_place"})
    with ThreadPoolExecutor(1) as pool:
        try:
            gone = socket.create_connection((host, int(port)))
            gone.sendall(
                b"POST /generate HTTP/1.1\r\nHost: e\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
            )
            beside = pool.submit(call, url, "POST", "/generate", {"input_ids": PROMPT, "sampling_params": {"max_new_tokens": 2}})
            until(lambda s: s["held"] - before["held"] == 2, "the engine holds both requests")
            gone.close()
            until(lambda s: s["aborted"] - before["aborted"] == 1, "the engine aborts the row of the client that hung up")
            assert info()["held"] - before["held"] == 1
        finally:
            call(url, "POST", "/continue_generation", {})
        status, out = beside.result()
    assert status == 200 and out["meta_info"]["finish_reason"]["type"] in ("length", "stop"), out
