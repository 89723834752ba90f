"""The conformance tests and the engine client against SGLang's own HTTP server code.

SGLang cannot run here (its scheduler needs CUDA), but its front end can: ``tests/support/
sglang_app/serve.py`` starts SGLang's real ``launch_server`` (FastAPI app, TokenizerManager,
DetokenizerManager, warm-up) from a private venv (``tests/support/sglang_env.py``) with a stand-in
for the scheduler that generates by a fixed rule. So every request below passes SGLang's own
validation (``GenerateReqInput`` and its normalisation, ``SamplingParams`` normalize/verify,
length checks, the admin routes' pydantic bodies), and every answer is shaped by SGLang's own
code (meta_info, logprob lists, cumulative stream chunks, abort and pause semantics); only the
token ids and logprobs come from the rule, so they are checked exactly.

Covered: the conformance tests of ``test_sglang_protocol.py`` (all but the embedded-only ones,
imported below and run against this server); ``EngineClient``: generate with logprobs and top
logprobs, stop tokens, streaming, a caller's abort (also of a retracted request, answered from the
waiting queue), resubmission after the trainer's pause-update-continue (``push_weights``) with
per-token versions, ``retract`` and ``in_place`` pauses, weight updates (async and the trainer's
blocking one), their failure, health, model info, server info; the gateway's engine requests
with every sampling option it forwards; the trainer's collective weight sync
(``CollectiveWeightPush`` over gloo). Per model (the embedded model and SmolLM2-135M-Instruct,
``model.path=smollm2-135m-instruct``, each its own server on its config, tokenizer and chat
template): SGLang's own chat path (``/v1/chat/completions``: its template manager, its
``apply_chat_template`` under its transformers pin, its DetokenizerManager) renders the prompt
ids the gateway renders for the same messages, and its text path (``/generate`` with ``text``)
tokenizes as the project's tokenizer does. Not covered: what the stand-in does not do (see serve.py),
SGLang's own forward and logprobs of any model (its model runner needs CUDA kernels: on every model
the tokens are the stand-in's rule), API keys, /health while paused (SGLang's waits for the pause
to end, up to 20 s, then 503).

Skipped, with the reason, when the private venv is absent; ``make test-sglang-app`` builds it and
sets ``AREAL_REQUIRE_SGLANG_APP=1``, which turns the skip into a failure.
"""

from __future__ import annotations

import asyncio
import json
import shutil
from pathlib import Path

import pytest
import test_sglang_protocol as protocol
import torch
from sglang_app.serve import script_logprob, script_token
from sglang_env import SERVE
from sglang_env import venv as sglang_venv
from test_sglang_protocol import (  # noqa: F401 (pytest runs them here: IMPORTED below)
    test_abort_request_returns_partial_tokens,
    test_abort_request_without_a_rid_is_ignored,
    test_context_overflow_zero_budget_and_final_meta,
    test_distributed_update_runs_inside_a_weight_update_session,
    test_errors,
    test_generate_shapes_single_and_batch,
    test_health_and_model_info,
    test_pause_abort_and_continue,
    test_stream_is_cumulative_and_matches_non_stream,
    test_top_logprobs_and_n,
    test_update_weights_from_disk_sets_version,
)
from transformers import AutoTokenizer

from areal.embedded import ensure_embedded_model
from areal.embedded.pretrained import NAME as SMOLLM2
from areal.embedded.pretrained import ensure_pretrained_model
from areal.engine.client import EngineClient, EngineError
from areal.engine.launch import EngineProcess, free_port, launch_command
from areal.gateway import Gateway, GatewayConfig
from areal.gateway.server import handle
from areal.protocol import GatewayRequest
from areal.weights.collective import CollectiveWeightPush
from areal.weights.disk import push_weights, update_weights_from_disk_sync

PROMPT = [11, 12, 13, 14]
# The conformance tests imported above from test_sglang_protocol, which pytest runs here too.
IMPORTED = {fn for name, fn in dict(globals()).items() if name.startswith("test_") and getattr(fn, "__module__", None) == protocol.__name__}


def expected(prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    return [script_token(prompt, i) for i in range(n)], [script_logprob(i) for i in range(n)]


@pytest.fixture(scope="module")
def sglang() -> Path:
    """The private venv's python, or a skip (a failure under AREAL_REQUIRE_SGLANG_APP)."""
    return sglang_venv().need("AREAL_REQUIRE_SGLANG_APP", "make test-sglang-app builds it: make sglang-venv")


def _config_copy(source: Path, target: Path) -> Path:
    """A model folder's config, tokenizer and chat template, without its weights (the stand-in
    scheduler loads none)."""
    target.mkdir()
    for path in source.iterdir():
        if path.name.endswith((".json", ".jinja")):
            shutil.copy(path, target / path.name)
    return target


def _serve(python: Path, model: Path, log: Path) -> EngineProcess:
    template = f"{python} {SERVE} --model-path {{model}} --host {{host}} --port {{port}} --token-delay-s 0.01"
    return launch_command(template, str(model), free_port(), str(log), timeout_s=300)


@pytest.fixture(scope="module")
def model_dir(sglang: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model's config and tokenizer."""
    return _config_copy(ensure_embedded_model(progress=False), tmp_path_factory.mktemp("sglang_app") / "model")


SERVER_LOGS: dict[str, Path] = {}  # url -> its server's log


@pytest.fixture(scope="module")
def url(sglang: Path, model_dir: Path, tmp_path_factory: pytest.TempPathFactory):
    log = tmp_path_factory.mktemp("sglang_app_log") / "server.log"
    proc = _serve(sglang, model_dir, log)
    SERVER_LOGS[proc.url] = log
    yield proc.url
    proc.stop()


@pytest.fixture(scope="module")
def smollm2_server(sglang: Path, tmp_path_factory: pytest.TempPathFactory):
    """SGLang's server on SmolLM2-135M-Instruct's config, tokenizer and chat template."""
    model = _config_copy(ensure_pretrained_model(progress=False), tmp_path_factory.mktemp("sglang_smollm2") / SMOLLM2)
    proc = _serve(sglang, model, tmp_path_factory.mktemp("sglang_smollm2_log") / "server.log")
    yield model, proc.url
    proc.stop()


@pytest.fixture(scope="module", params=["embedded", SMOLLM2])
def served(request: pytest.FixtureRequest) -> tuple[Path, str]:
    """(model folder, url) of each model's server; the embedded one is the module's ``url``."""
    if request.param == "embedded":
        return request.getfixturevalue("model_dir"), request.getfixturevalue("url")
    return request.getfixturevalue("smollm2_server")


def test_every_portable_conformance_test_runs_here() -> None:
    portable = {
        fn
        for name, fn in vars(protocol).items()
        if name.startswith("test_") and protocol.embedded_only.mark not in getattr(fn, "pytestmark", [])
    }
    assert portable == IMPORTED


async def _running(client: EngineClient, max_new_tokens: int) -> asyncio.Task:
    """``client``'s generation of ``max_new_tokens`` tokens after PROMPT (``ignore_eos``), as a
    task, once the engine is running it."""
    task = asyncio.create_task(client.generate(PROMPT, {"max_new_tokens": max_new_tokens, "ignore_eos": True}))
    while (await client.server_info())["internal_states"][0]["num_running_reqs"] == 0:
        await asyncio.sleep(0.02)
    return task


def run(coro):
    return asyncio.run(coro)


def test_client_generate_exact_tokens_logprobs_and_tops(url: str) -> None:
    async def go():
        client = EngineClient(url)
        try:
            plain = await client.generate(PROMPT, {"max_new_tokens": 6, "ignore_eos": True})
            tops = await client.generate(PROMPT, {"max_new_tokens": 3, "ignore_eos": True}, top_logprobs_num=2)
            return plain, tops
        finally:
            await client.close()

    plain, tops = run(go())
    ids, lps = expected(PROMPT, 6)
    assert plain.output_ids == ids and plain.output_logprobs == lps
    assert plain.finish_reason == "length" and plain.prompt_tokens == len(PROMPT) and plain.completion_tokens == 6
    assert plain.output_versions == ["default"] * 6 and plain.resubmits == 0
    assert tops.output_top_logprobs == [[(script_logprob(i), t), (script_logprob(i) - 1, t + 1)] for i, t in enumerate(ids[:3])]


def test_client_stop_token_and_stream(url: str) -> None:
    ids, lps = expected(PROMPT, 8)

    async def go():
        client = EngineClient(url)
        try:
            stopped = await client.generate(PROMPT, {"max_new_tokens": 8, "stop_token_ids": [ids[2]]})
            chunks = [c async for c in client.generate_stream(PROMPT, {"max_new_tokens": 8, "ignore_eos": True})]
            return stopped, chunks
        finally:
            await client.close()

    stopped, chunks = run(go())
    assert stopped.output_ids == ids[:3] and stopped.finish_reason == "stop"  # the stop token is kept
    assert [c.finish_reason for c in chunks] == [""] * (len(chunks) - 1) + ["length"]
    assert all(c.output_ids == ids[: len(c.output_ids)] for c in chunks)
    assert chunks[-1].output_ids == ids and chunks[-1].output_logprobs == lps


def test_client_abort_by_caller_is_not_resubmitted(url: str) -> None:
    async def go():
        client = EngineClient(url)
        try:
            chunks = []
            async for chunk in client.generate_stream(PROMPT, {"max_new_tokens": 400, "ignore_eos": True}, rid="caller-abort"):
                chunks.append(chunk)
                if len(chunks) == 1:
                    await client.abort_request("caller-abort")
            return chunks[-1]
        finally:
            await client.close()

    final = run(go())
    ids, lps = expected(PROMPT, len(final.output_ids))
    assert final.finish_reason == "abort" and final.resubmits == 0
    assert 0 < len(final.output_ids) < 400 and final.output_ids == ids and final.output_logprobs == lps


def test_push_weights_mid_generation_resubmits_with_versions(url: str, model_dir: Path) -> None:
    """The RL weight sync: the trainer's pause(abort) / update / continue while the client is
    generating; the client resubmits prompt + tokens so far and stitches the parts, each token
    keeping the version that sampled it."""
    budget = 120

    async def go():
        client = EngineClient(url)
        try:
            task = await _running(client, budget)
            await asyncio.to_thread(push_weights, [url], model_dir, 7, 60.0)
            return await task
        finally:
            await client.close()

    result = run(go())
    k = result.output_versions.count("default")
    assert 0 < k < budget and result.output_versions == ["default"] * k + ["7"] * (budget - k)
    assert result.resubmits == 1 and result.finish_reason == "length" and result.weight_version == "7"
    first, first_lps = expected(PROMPT, k)
    rest, rest_lps = expected(PROMPT + first, budget - k)
    assert result.output_ids == first + rest and result.output_logprobs == first_lps + rest_lps
    update_weights_from_disk_sync(url, str(model_dir), "default")


@pytest.mark.parametrize("mode", ["retract", "in_place"])
def test_client_pause_modes_resume_inside_the_engine(url: str, mode: str) -> None:
    async def go():
        client = EngineClient(url)
        try:
            running = await _running(client, 100)
            await client.pause_generation(mode)
            waiting = asyncio.create_task(client.generate([5, 6], {"max_new_tokens": 3, "ignore_eos": True}))
            await asyncio.sleep(0.5)
            blocked = not running.done() and not waiting.done()
            await client.continue_generation()
            return blocked, await running, await waiting
        finally:
            await client.close()

    blocked, running, waiting = run(go())
    assert blocked
    assert running.output_ids == expected(PROMPT, 100)[0] and running.finish_reason == "length" and running.resubmits == 0
    assert waiting.output_ids == expected([5, 6], 3)[0]


def test_client_weight_updates_health_and_info(url: str, model_dir: Path) -> None:
    async def go():
        client = EngineClient(url)
        try:
            with pytest.raises(EngineError) as failed:
                await client.update_weights_from_disk(str(model_dir / "missing"), "never")
            await client.update_weights_from_disk(str(model_dir), "v-async")
            info = await client.model_info()
            gen = await client.generate(PROMPT, {"max_new_tokens": 2})
            healthy = await client.health()
            await client.update_weights_from_disk(str(model_dir), "default")
            return failed.value, info, gen, healthy
        finally:
            await client.close()

    failed, info, gen, healthy = run(go())
    assert failed.status == 400 and "missing" in failed.message
    assert info["weight_version"] == "v-async" and info["model_path"] == str(model_dir) and info["is_generation"] is True
    assert gen.weight_version == "v-async" and gen.output_versions == ["v-async"] * 2
    assert healthy is True
    with pytest.raises(EngineError):
        update_weights_from_disk_sync(url, "/nonexistent/model", None)


def test_gateway_requests_pass_sglang_validation(url: str, model_dir: Path) -> None:
    """Chat requests with every sampling option the gateway forwards (temperature, top_p, top_k,
    min_p, repetition_penalty, seed, stop, n, logprobs), plain and streamed: SGLang's
    TokenizerManager takes each engine request the gateway builds, and the gateway records the
    stand-in's exact ids and logprobs."""
    options = {"temperature": 0.7, "top_p": 0.9, "top_k": 20, "min_p": 0.05, "repetition_penalty": 1.1, "seed": 3, "stop": ["###"]}

    async def go():
        gw = Gateway(EngineClient(url), AutoTokenizer.from_pretrained(model_dir), GatewayConfig())
        key = gw.open_session("v0")
        headers = {"authorization": f"Bearer {key}"}
        replies = []
        for i, extra in enumerate(({"n": 2, "logprobs": True, "top_logprobs": 2}, {"stream": True}, {})):
            messages = [{"role": "user", "content": f"What is {i} + 3?"}]
            body = json.dumps({"model": "m", "messages": messages, "max_tokens": 6, **options, **extra}).encode()
            request = GatewayRequest(request_id=i, method="POST", path="/v1/chat/completions", headers=headers, body=body)
            replies.append(await handle(gw, request))
        stops = set(gw.stop_token_ids)
        interactions = list(gw.close_session(key).interactions.values())
        await gw.engine.close()
        return replies, interactions, stops

    replies, interactions, stops = run(go())
    assert [r.status for r in replies] == [200, 200, 200], [r.body for r in replies]
    assert len(interactions) == 4  # n=2, then one each
    for inter in interactions:
        ids = [script_token(inter.prompt_ids, i) for i in range(6)]
        cut = next((i + 1 for i, t in enumerate(ids) if t in stops), 6)
        assert inter.output_ids == ids[:cut] and inter.output_logprobs == [script_logprob(i) for i in range(cut)]


def test_the_gateways_constraints_pass_sglang_validation_and_reach_its_scheduler(url: str, model_dir: Path) -> None:
    """Structured output and a forced call (docs/openai.md): the engine requests the gateway builds
    for ``response_format`` json_schema, Responses ``text.format`` and ``tool_choice`` "required"
    pass SGLang's own validation, and its scheduler receives the constraint the gateway sent, as
    SGLang's keys: ``json_schema`` for a schema alone, ``structural_tag`` for a call (the stand-in
    decodes unconstrained, so only the requests are checked here)."""
    schema = {"type": "object", "properties": {"answer": {"type": "integer"}}, "required": ["answer"], "additionalProperties": False}
    tool = {"name": "calc", "parameters": {"type": "object", "properties": {"expr": {"type": "string"}}, "required": ["expr"]}}
    user = [{"role": "user", "content": "What is 3+4?"}]
    bodies = [
        (
            "/v1/chat/completions",
            {"messages": user, "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}}},
        ),
        ("/v1/responses", {"input": "What is 3+4?", "text": {"format": {"type": "json_schema", "name": "a", "schema": schema}}}),
        ("/v1/chat/completions", {"messages": user, "tools": [{"type": "function", "function": tool}], "tool_choice": "required"}),
    ]

    async def go():
        gw = Gateway(EngineClient(url), AutoTokenizer.from_pretrained(model_dir), GatewayConfig())
        key = gw.open_session("v0")
        headers = {"authorization": f"Bearer {key}"}
        replies = []
        for i, (path, body) in enumerate(bodies):
            cap = "max_output_tokens" if path == "/v1/responses" else "max_tokens"
            raw = json.dumps({"model": "m", cap: 6, **body}).encode()
            replies.append(await handle(gw, GatewayRequest(request_id=i, method="POST", path=path, headers=headers, body=raw)))
        interactions = list(gw.close_session(key).interactions.values())
        await gw.engine.close()
        return replies, interactions

    def constraints() -> list[dict]:  # the stand-in's lines, in the order its requests came
        lines = SERVER_LOGS[url].read_text().splitlines()
        return [json.loads(line[line.index("{") :]) for line in lines if '{"stand-in constraint"' in line]

    before = len(constraints())
    replies, interactions = run(go())
    assert len(interactions) == 3, [r.body for r in replies]  # each call was sampled: SGLang took every request
    got = constraints()[before:]
    assert len(got) == 3, (got, SERVER_LOGS[url].read_text()[-3000:])
    for row in got[:2]:  # a schema alone: json_schema, the response format's schema
        assert json.loads(row["json_schema"]) == schema and not row["structural_tag"]
    tag = json.loads(got[2]["structural_tag"])  # the forced call: a structural tag naming the tool
    assert not got[2]["json_schema"] and "calc" in json.dumps(tag)


def test_collective_weight_push_over_gloo(url: str, model_dir: Path) -> None:
    """The trainer's collective weight sync (``CollectiveWeightPush``, gloo) against SGLang's
    routes: the group is formed with SGLang's own ``init_custom_process_group``, the broadcasts
    land in list order (read back through /get_weights_by_name), a generation in flight is
    resubmitted and its tokens carry the version that sampled them."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))  # the stand-in loads no model: any module
    pusher = CollectiveWeightPush([url], "127.0.0.1", free_port("127.0.0.1"), backend="gloo", timeout_s=60)

    async def go():
        client = EngineClient(url)
        try:
            task = await _running(client, 120)
            await asyncio.to_thread(pusher.push, model, 5)
            return await task
        finally:
            await client.close()

    pusher.init()
    try:
        result = run(go())
        for name, tensor in model.state_dict().items():
            status, received = protocol.call(url, "POST", "/get_weights_by_name", {"name": name})
            assert status == 200 and received == tensor.tolist(), name
        assert protocol.call(url, "GET", "/get_model_info")[1]["weight_version"] == "5"
    finally:
        pusher.close()
    k = result.output_versions.count("default")
    assert 0 < k < 120 and result.output_versions == ["default"] * k + ["5"] * (120 - k) and result.resubmits == 1
    first = expected(PROMPT, k)[0]
    assert result.output_ids == first + expected(PROMPT + first, 120 - k)[0]
    update_weights_from_disk_sync(url, str(model_dir), "default")


def test_abort_of_a_retracted_request_comes_from_the_waiting_queue(url: str) -> None:
    """A request retracted by /pause_generation {"mode": "retract"} waits in the queue; aborted
    there, SGLang answers with the tokens it had, "Abort in waiting queue" and no prompt_tokens,
    and EngineClient hands that back (the caller aborted it) as a partial generation."""
    body = {"input_ids": PROMPT, "rid": "retracted", "return_logprob": True, "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}

    async def retract_and_abort() -> None:
        await asyncio.to_thread(protocol.call, url, "POST", "/pause_generation", {"mode": "retract"})
        await asyncio.to_thread(protocol.call, url, "POST", "/abort_request", {"rid": "retracted"})

    final = run(protocol.read_stream(url, body, on_first=retract_and_abort))[-1]
    assert protocol.call(url, "POST", "/continue_generation", {})[0] == 200
    meta = final["meta_info"]
    assert meta["finish_reason"] == {"type": "abort", "message": "Abort in waiting queue"} and "prompt_tokens" not in meta
    n = len(final["output_ids"])
    assert 0 < n < 400 and final["output_ids"] == expected(PROMPT, n)[0]

    async def go():
        client = EngineClient(url)
        try:
            async for chunk in client.generate_stream(PROMPT, body["sampling_params"], rid="retracted-client"):
                if not chunk.finish_reason:
                    await client.pause_generation("retract")
                    await client.abort_request("retracted-client")
                else:
                    final = chunk
            await client.continue_generation()
            return final
        finally:
            await client.close()

    result = run(go())
    ids, lps = expected(PROMPT, len(result.output_ids))
    assert result.finish_reason == "abort" and result.resubmits == 0 and result.prompt_tokens == len(PROMPT)
    assert 0 < len(result.output_ids) < 400 and result.output_ids == ids and result.output_logprobs == lps


# ------------------------------------------------------------------------------------------
# Per model: SGLang's own tokenizer, chat template and detokenizer against the project's.
# ------------------------------------------------------------------------------------------

CONVERSATIONS = [
    [{"role": "user", "content": "What is 17 + 25?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a prime number above 50."}],
    [
        {"role": "user", "content": "Café au lait, s'il vous plaît: 2 × 3 = ?"},
        {"role": "assistant", "content": "6, naïvement."},
        {"role": "user", "content": "Und 4 · 5? 数字で 🙂"},
    ],
]
TEXTS = ["Tom has 3 apples and buys 4 more.", "  leading spaces, tabs\tand a newline\n", "Ünïcödé: 東京 🙂 — ok"]


def test_sglang_chat_renders_the_gateways_prompt(served: tuple[Path, str]) -> None:
    """Each conversation through SGLang's ``/v1/chat/completions`` (its template manager and its
    ``apply_chat_template``, under its own transformers pin) and through the gateway (a session
    each, its engine requests to the same server): the same prompt ids, which are the model's
    template rendered by this project's transformers; the stand-in's ids for that prompt back
    from both; SGLang's DetokenizerManager text is the project tokenizer's decode of them."""
    model, url = served
    tok = AutoTokenizer.from_pretrained(model)
    n = 5

    async def go():
        gw = Gateway(EngineClient(url), tok, GatewayConfig())
        out = []
        for i, messages in enumerate(CONVERSATIONS):
            key = gw.open_session(f"chat-{i}")
            headers = {"authorization": f"Bearer {key}"}
            body = json.dumps({"model": "m", "messages": messages, "max_tokens": n, "temperature": 0.0}).encode()
            reply = await handle(gw, GatewayRequest(request_id=i, method="POST", path="/v1/chat/completions", headers=headers, body=body))
            assert reply.status == 200, reply.body
            (inter,) = gw.close_session(key).interactions.values()
            out.append((inter, json.loads(reply.body)["choices"][0]["message"]["content"]))
        await gw.engine.close()
        return out

    gateway = run(go())
    for messages, (inter, gateway_text) in zip(CONVERSATIONS, gateway):
        body = {"model": "m", "messages": messages, "max_tokens": n, "return_prompt_token_ids": True, "return_token_ids": True}
        status, reply = protocol.call(url, "POST", "/v1/chat/completions", body)
        assert status == 200, reply
        (choice,) = reply["choices"]
        render = tok.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
        assert choice["prompt_token_ids"] == inter.prompt_ids == render
        assert reply["usage"]["prompt_tokens"] == len(render)
        ids = expected(render, n)[0]
        assert choice["response_token_ids"] == inter.output_ids == ids and choice["finish_reason"] == "length"
        assert choice["message"]["content"] == gateway_text == tok.decode(ids, skip_special_tokens=True)


def test_sglang_tokenizes_and_detokenizes_as_the_project(served: tuple[Path, str]) -> None:
    """``/generate`` with ``text``: SGLang's TokenizerManager encodes it to the ids the project's
    tokenizer gives (read back as the prompt's logprob ids), and its DetokenizerManager's text of
    the stand-in's tokens is the project's decode of them, streamed or not."""
    model, url = served
    tok = AutoTokenizer.from_pretrained(model)
    chat = tok.apply_chat_template(CONVERSATIONS[2], add_generation_prompt=True, tokenize=False)
    for text in [*TEXTS, chat]:
        body = {"text": text, "return_logprob": True, "logprob_start_len": 0, "sampling_params": {"max_new_tokens": 6, "ignore_eos": True}}
        status, out = protocol.call(url, "POST", "/generate", body)
        assert status == 200, out
        prompt = tok(text)["input_ids"]
        assert [entry[1] for entry in out["meta_info"]["input_token_logprobs"]] == prompt
        assert out["output_ids"] == expected(prompt, 6)[0]
        assert out["text"] == tok.decode(out["output_ids"], skip_special_tokens=True)
        chunks = run(protocol.read_stream(url, {**body, "stream": True}))
        assert chunks[-1]["output_ids"] == out["output_ids"] and chunks[-1]["text"] == out["text"]
