"""The embedded engine as a real subprocess, driven over real HTTP by the real client.

The model is a tiny random Qwen2ForCausalLM saved with ``save_pretrained``, with a trivial
word-level tokenizer ("t<id>" per token, decoded without separators, "<eos>" special) so that ``text`` is checked too. Its eos
id is chosen as the third greedy token after PROMPT, so greedy decoding of PROMPT stops on EOS.
"""

from __future__ import annotations

import asyncio
import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

from areal.engine.client import (
    EngineClient,
    EngineError,
    EngineUnavailable,
    launch_embedded_engine,
    update_weights_from_disk_sync,
)

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
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False, initializer_range=0.2)
    model = Qwen2ForCausalLM(cfg).eval()
    model.generation_config.eos_token_id = None
    with torch.no_grad():
        greedy = model.generate(torch.tensor([PROMPT]), max_new_tokens=3, do_sample=False, pad_token_id=0)
    eos = int(greedy[0, -1])
    assert eos not in greedy[0, len(PROMPT):-1].tolist()
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


def post(url: str, body: object) -> tuple[int, object]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(url: str) -> tuple[int, object]:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return resp.status, json.loads(resp.read())


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
        assert a["output_ids"] == ref[0, len(prompt):].tolist()


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


def test_batched_array_equals_single_requests(engine_url: str) -> None:
    prompts = [PROMPT, [100, 200, 300, 400, 401, 402, 403], [9]]
    status, outs = post(f"{engine_url}/generate", {
        "input_ids": prompts, "rid": "batch",
        "sampling_params": {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True},
        "return_logprob": True})
    assert status == 200 and isinstance(outs, list) and len(outs) == 3
    assert [o["meta_info"]["id"] for o in outs] == ["batch_0", "batch_1", "batch_2"]
    for prompt, batched in zip(prompts, outs):
        single = generate(engine_url, prompt, temperature=0, max_new_tokens=10, ignore_eos=True)
        assert batched["output_ids"] == single["output_ids"]
        diffs = [abs(a[0] - b[0]) for a, b in zip(batched["meta_info"]["output_token_logprobs"],
                                                    single["meta_info"]["output_token_logprobs"])]
        assert max(diffs) < 1e-4  # left padding must not change the numbers


def test_concurrent_requests_are_batched(engine_url: str) -> None:
    async def run() -> tuple[list, dict, dict]:
        client = EngineClient(engine_url)
        before = await client.server_info()
        results = await asyncio.gather(*(
            client.generate([i + 1, i + 2, i + 3], {"temperature": 1.0, "max_new_tokens": 16, "ignore_eos": True})
            for i in range(16)))
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
    status, outs = post(f"{engine_url}/generate", {
        "input_ids": [[400, 401], PROMPT],
        "sampling_params": [dict(sp, sampling_seed=7), dict(sp, sampling_seed=1234)]})
    assert status == 200 and outs[1]["output_ids"] == a["output_ids"]


def test_top_k_one_is_greedy(engine_url: str) -> None:
    greedy = generate(engine_url, PROMPT, temperature=0, max_new_tokens=12, ignore_eos=True)
    top1 = generate(engine_url, PROMPT, temperature=1.0, top_k=1, max_new_tokens=12, ignore_eos=True)
    assert top1["output_ids"] == greedy["output_ids"]


def test_bad_requests_get_400(engine_url: str) -> None:
    status, out = post(f"{engine_url}/generate", {"input_ids": PROMPT, "sampling_params": {"max_tokens": 4}})
    assert status == 400 and "max_tokens" in out["error"]
    status, out = post(f"{engine_url}/generate", {"input_ids": PROMPT, "sampling_params": {"min_p": 0.1}})
    assert status == 400 and "min_p" in out["error"]
    status, _ = post(f"{engine_url}/generate", {"input_ids": PROMPT, "sampling_params": {"n": 1, "max_new_tokens": 1}})
    assert status == 200  # an unsupported key at its SGLang default is a no-op
    status, out = post(f"{engine_url}/generate", {"input_ids": [], "sampling_params": {}})
    assert status == 400 and "empty" in out["error"]
    status, out = post(f"{engine_url}/generate", {"input_ids": PROMPT, "stream": True})
    assert status == 400 and out["error"] == "stream is not supported yet"
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
