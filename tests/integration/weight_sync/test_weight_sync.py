"""Weights to engines over a collective (SGLang's NCCL path), run for real over gloo on CPU.

Two real embedded-engine subprocesses (ranks 1 and 2) and this process as the trainer (rank 0)
form one weight-update group; CollectiveWeightPush broadcasts a perturbed copy of the served
model and the engines must then generate exactly what HF ``generate`` does with those weights.
The model ties its embeddings, so the tied lm_head travels once, under the embedding's name.
The nccl test runs only on a GPU machine against a real SGLang server (``AREAL_SGLANG_URL``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import os
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch
from http_json import post
from tiny_models import tiny_qwen2
from transformers import AutoModelForCausalLM

from areal.engine.client import EngineClient
from areal.engine.launch import free_port, launch_embedded_engine
from areal.weights import WeightUpdateError
from areal.weights.collective import (
    CollectiveWeightPush,
    join_weight_group,
    leave_weight_group,
    local_address_towards,
    named_tensors_to_send,
)

VOCAB = 256
PROMPT = [5, 6, 7, 8]
GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
LONG = {"temperature": 1.0, "max_new_tokens": 240, "ignore_eos": True}  # long enough to be mid-way at the push


TINY = dict(vocab_size=VOCAB, tie_word_embeddings=True, initializer_range=0.2)  # the tied lm_head travels once


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    model = tiny_qwen2(**TINY)
    model.generation_config.eos_token_id = None
    path = tmp_path_factory.mktemp("weight_sync") / "model"
    model.save_pretrained(path)
    return path


def _load(model_dir: Path) -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    model.generation_config.eos_token_id = None
    return model


@pytest.fixture(scope="module")
def perturbed(model_dir: Path) -> torch.nn.Module:
    """The served model plus noise: what the trainer pushes (so a push that loads nothing fails)."""
    model = _load(model_dir)
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.1)
    return model


@pytest.fixture(scope="module")
def engines(model_dir: Path):
    procs = [launch_embedded_engine(str(model_dir), threads=1, timeout_s=120) for _ in range(2)]
    yield [p.url for p in procs]
    for p in procs:
        p.stop()


@pytest.fixture(scope="module")
def pusher(engines: list[str]):
    push = CollectiveWeightPush(engines, "127.0.0.1", free_port("127.0.0.1"), backend="gloo", timeout_s=60)
    push.init()
    yield push
    push.close()


def engine_greedy(url: str) -> list[int]:
    status, out = post(f"{url}/generate", {"input_ids": PROMPT, "sampling_params": GREEDY})
    assert status == 200, out
    return out["output_ids"]


def hf_greedy(model: torch.nn.Module) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([PROMPT]), max_new_tokens=GREEDY["max_new_tokens"], do_sample=False, pad_token_id=0)
    return out[0, len(PROMPT) :].tolist()


@torch.no_grad()
def teacher_forced(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """Logprobs of ids[len(PROMPT):] under ``model`` (temperature 1, as greedy logprobs are)."""
    logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, len(PROMPT) - 1 : -1].float(), -1)  # (T_out, V)
    return logp.gather(1, torch.tensor(ids[len(PROMPT) :])[:, None]).squeeze(1)


def weight_version(url: str) -> str:
    with urllib.request.urlopen(f"{url}/get_model_info", timeout=60) as resp:
        return json.loads(resp.read())["weight_version"]


def test_tied_weights_travel_once_in_state_dict_order(perturbed: torch.nn.Module) -> None:
    sent = [n for n, _ in named_tensors_to_send(perturbed)]
    state = list(perturbed.state_dict())
    assert "lm_head.weight" in state and "lm_head.weight" not in sent  # tied to model.embed_tokens.weight
    assert sent == [n for n in state if n != "lm_head.weight"]


def test_push_over_gloo_makes_every_engine_generate_like_hf_with_the_new_weights(
    engines: list[str], pusher: CollectiveWeightPush, model_dir: Path, perturbed: torch.nn.Module
) -> None:
    assert pusher.rank_offsets == [1, 2] and pusher.world_size == 3
    before = [engine_greedy(u) for u in engines]
    assert before == [hf_greedy(_load(model_dir))] * 2
    expected = hf_greedy(perturbed)
    assert expected != before[0], "the perturbation must change greedy output, or this test could not fail"
    pusher.push(perturbed, 3)
    for url in engines:
        assert engine_greedy(url) == expected
        assert weight_version(url) == "3"


def test_generation_in_flight_across_a_push_resumes_with_per_token_versions(
    engines: list[str], pusher: CollectiveWeightPush, perturbed: torch.nn.Module
) -> None:
    """A push lands mid-generation: the generation is aborted, resubmitted, and its tokens carry
    the old version, then the new one. The push must land while the generation runs: on a
    machine so loaded that the engine wrote all its tokens before the client read the first
    chunk and held it, an attempt is not the scenario, so it is made again (at most 5 times)."""
    for attempt in range(5):
        served, version = weight_version(engines[0]), "4" if attempt == 0 else f"4-retry{attempt}"

        async def run() -> list:
            client = EngineClient(engines[0])
            chunks = []
            async for chunk in client.generate_stream(PROMPT, LONG):
                chunks.append(chunk)
                if len(chunks) == 1 and not chunk.finish_reason:  # still generating: push mid-way
                    # Hold it first (in place, as SGLang's pause does): the engine could otherwise
                    # finish all 240 tokens before the push's own pause arrives.
                    await asyncio.to_thread(post, f"{engines[0]}/pause_generation", {"mode": "in_place"})
                    await asyncio.to_thread(pusher.push, perturbed, version)
            await client.close()
            return chunks

        final = asyncio.run(run())[-1]
        if final.resubmits:
            break
    assert final.finish_reason == "length" and final.resubmits == 1
    assert len(final.output_ids) == len(final.output_versions) == LONG["max_new_tokens"]
    cut = final.output_versions.index(version)
    assert 0 < cut
    assert set(final.output_versions[:cut]) == {served} and set(final.output_versions[cut:]) == {version}


def test_mismatched_weights_are_refused_after_the_broadcast_and_old_weights_keep_serving(
    engines: list[str], pusher: CollectiveWeightPush, perturbed: torch.nn.Module
) -> None:
    pusher.push(perturbed, 5)
    served = engine_greedy(engines[1])
    wrong = tiny_qwen2(seed=None, **TINY, hidden_size=32)  # same names, other shapes
    with pytest.raises(WeightUpdateError, match="shape_mismatch"):
        pusher.push(wrong, 6)
    for url in engines:
        assert weight_version(url) == "5"
        assert engine_greedy(url) == served
    pusher.push(perturbed, 7)  # the group is still in step: the engines received every broadcast
    assert weight_version(engines[0]) == "7"


def test_refusals_are_400_with_a_message(engines: list[str], pusher: CollectiveWeightPush) -> None:
    url = engines[0]
    body = {"master_address": "127.0.0.1", "master_port": 1, "rank_offset": 1, "world_size": 2}
    if not torch.cuda.is_available():
        status, out = post(f"{url}/init_weights_update_group", {**body, "backend": "nccl"})
        assert status == 400 and out["success"] is False and "CUDA" in out["message"] and "gloo" in out["message"]
    status, out = post(f"{url}/init_weights_update_group", {**body, "backend": "gloo"})
    assert status == 400 and "already exists" in out["message"]  # the pusher's group has the default name
    status, out = post(f"{url}/init_weights_update_group", {**body, "rank_offset": 2, "backend": "gloo", "group_name": "other"})
    assert status == 400 and "rank_offset" in out["message"]
    update = {"names": ["model.norm.weight"], "dtypes": ["float32"], "shapes": [[64]]}
    status, out = post(f"{url}/update_weights_from_distributed", update)  # as SGLang 0.5.23: only inside a session
    assert status == 400 and "between begin_weight_update() and end_weight_update()" in out["message"]
    assert post(f"{url}/end_weight_update", {})[0] == 400  # none is open
    assert post(f"{url}/begin_weight_update", {}) == (200, {"success": True, "message": "Success"})
    try:
        assert post(f"{url}/begin_weight_update", {})[0] == 400  # one at a time
        status, out = post(f"{url}/update_weights_from_distributed", {**update, "group_name": "nope"})
        assert status == 400 and "no weight update group named 'nope'" in out["message"]
        status, out = post(f"{url}/update_weights_from_distributed", {**update, "dtypes": ["float99"]})
        assert status == 400 and "float99" in out["message"]
        status, out = post(f"{url}/update_weights_from_distributed", {**update, "shapes": []})
        assert status == 400 and "differ in length" in out["message"]
    finally:
        assert post(f"{url}/end_weight_update", {})[0] == 200
    status, out = post(f"{url}/destroy_weights_update_group", {"group_name": "nope"})
    assert status == 400 and out["success"] is False


def test_an_engine_refusing_to_join_fails_init_at_once_naming_it(engines: list[str]) -> None:
    """The trainer's own rendezvous would wait for the refusing engine until its timeout; the
    engine's 400 must end init() at once instead."""
    port = free_port("127.0.0.1")
    join = {"master_address": "127.0.0.1", "master_port": port, "rank_offset": 1, "world_size": 2, "group_name": "taken", "backend": "gloo"}
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # engine 0 gets a group named "taken"
        reply = pool.submit(post, f"{engines[0]}/init_weights_update_group", join)
        leave_weight_group(join_weight_group("gloo", "127.0.0.1", port, 0, 2, "taken", 60))
        assert reply.result()[1]["success"] is True
    push = CollectiveWeightPush(engines[:1], "127.0.0.1", free_port("127.0.0.1"), group_name="taken", backend="gloo", timeout_s=600)
    with pytest.raises(WeightUpdateError, match=f"{engines[0]}.*already exists"):
        push.init()
    assert push.group is None
    push.close()
    assert post(f"{engines[0]}/destroy_weights_update_group", {"group_name": "taken"})[1]["success"] is True


def test_close_destroys_the_group_on_every_engine_and_a_new_group_forms(engines: list[str], perturbed: torch.nn.Module) -> None:
    push = CollectiveWeightPush(engines[::-1], "127.0.0.1", free_port("127.0.0.1"), group_name="second", backend="gloo", timeout_s=60)
    push.init()
    push.push(perturbed, "second-1", pause=False)
    assert [weight_version(u) for u in engines] == ["second-1"] * 2
    push.close()
    assert post(f"{engines[0]}/begin_weight_update", {})[0] == 200
    status, out = post(f"{engines[0]}/update_weights_from_distributed", {"names": [], "dtypes": [], "shapes": [], "group_name": "second"})
    assert post(f"{engines[0]}/end_weight_update", {})[0] == 200
    assert status == 400 and "no weight update group named 'second'" in out["message"]


@pytest.mark.e2e
def test_trainer_with_collective_weight_sync_serves_its_final_weights(tmp_path: Path) -> None:
    """The real trainer subprocess (weight_sync="collective") trains two steps and broadcasts after
    each: the engine ends on version 2 generating what HF does with the trainer's final weights,
    and no weight directory was written."""
    from trainer_harness import Rings, make_group, make_model, run_trainer, trainer_job

    from areal.protocol import TrainerDone, TrainerReport

    model_dir = tmp_path / "model"
    model = make_model(model_dir, with_tokenizer=False)
    rings = Rings("wsync")
    engine = launch_embedded_engine(str(model_dir), threads=1, timeout_s=120)
    try:
        rng = np.random.default_rng(0)
        rings.put(0, *(make_group(model, f"g{g}", rng, size=2) for g in range(2)))
        config = trainer_job(model_dir, rings.names[0], tmp_path / "run", engine_urls=[engine.url], weight_sync="collective")
        rc, msgs = run_trainer(config, tmp_path)
        assert rc == 0, msgs
        assert [m.version for m in msgs if isinstance(m, TrainerReport)] == [1, 2]
        assert isinstance(msgs[-1], TrainerDone)
        assert weight_version(engine.url) == "2"
        final = _load(Path(msgs[-1].model_dir))
        status, out = post(f"{engine.url}/generate", {"input_ids": PROMPT, "sampling_params": GREEDY, "return_logprob": True})
        assert status == 200 and out["output_ids"] == hf_greedy(final)
        served = torch.tensor([lp for lp, _, _ in out["meta_info"]["output_token_logprobs"]])
        ids = PROMPT + out["output_ids"]
        assert (served - teacher_forced(final, ids)).abs().max() < 1e-4
        assert (served - teacher_forced(model, ids)).abs().max() > 1e-4  # training moved them: the test can fail
        assert not any((tmp_path / "run" / "weights").iterdir())  # nothing went through the disk
    finally:
        engine.stop()
        rings.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the nccl path needs a GPU")
def test_nccl_push_to_a_real_sglang_server() -> None:
    url = os.environ.get("AREAL_SGLANG_URL")
    if not url:
        pytest.skip("set AREAL_SGLANG_URL to a running SGLang server to test the nccl path")
    with urllib.request.urlopen(f"{url}/get_model_info", timeout=60) as resp:
        info = json.loads(resp.read())
    model = AutoModelForCausalLM.from_pretrained(info["model_path"], dtype=torch.bfloat16).cuda().eval()
    address = local_address_towards(url)
    push = CollectiveWeightPush([url], address, free_port(address), group_name="areal_test_nccl", backend="nccl", timeout_s=300)
    push.init()
    try:
        push.push(model, "nccl-test")
        assert json.loads(urllib.request.urlopen(f"{url}/get_model_info", timeout=60).read())["weight_version"] == "nccl-test"
        status, out = post(f"{url}/generate", {"input_ids": [1, 2, 3], "sampling_params": {"max_new_tokens": 4}})
        assert status == 200 and len(out["output_ids"]) >= 1
    finally:
        push.close()
