"""An AReaL user changes nothing (issue 22): one test per item of what broke.

Engine-backed tests use the instant stand-in engine (SGLang's /generate, always "42") with the
scripted model's tokenizer: the subject is the plumbing, not the model's replies.
"""

from __future__ import annotations

import asyncio
import itertools
import warnings

import httpx
import pytest
from instant_engine import with_instant_engine
from openai import AsyncOpenAI
from transformers import AutoTokenizer

from areal.embedded import ensure_scripted_model
from areal.engine.client import EngineClient


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(ensure_scripted_model())


_with_engine = with_instant_engine


# ---- 1. imports ------------------------------------------------------------------------------


@pytest.mark.e2e
def test_areal_import_paths(tok, tmp_path):
    from areal import PPOTrainer, workflow_context
    from areal.api.cli_args import GRPOConfig
    from areal.experimental.openai import ArealOpenAI
    from areal.reward import get_math_verify_worker
    from areal.reward.math_parser import process_results
    from areal.trainer import PPOTrainer as TrainerPathPPOTrainer  # AReaL's newer examples' path
    from areal.utils import stats_tracker
    from areal.utils.stats_logger import StatsLogger

    assert TrainerPathPPOTrainer is PPOTrainer
    assert workflow_context.stat_scope() == "rollout" and workflow_context.get().is_eval is False
    config = GRPOConfig(experiment_name="e", trial_name="t")
    config.cluster.fileroot = str(tmp_path)
    config = GRPOConfig(experiment_name="e", trial_name="t", cluster=config.cluster)
    assert StatsLogger.get_log_path(config.stats_logger) == str(tmp_path / "e" / "t")
    assert PPOTrainer(config).tokenizer is not None  # AReaL's trainer.tokenizer (embedded tokenizer)
    assert process_results("so \\boxed{12}", "#### 12")[0] == 1 and process_results("\\boxed{13}", "12")[0] == 0
    assert get_math_verify_worker().verify("The answer is \\boxed{1/2}", "0.5") == 1.0
    stats_tracker.get("rollout").scalar(reward=1.0)
    stats_tracker.get("rollout").scalar(reward=0.0)
    assert stats_tracker.export()["rollout/reward"] == 0.5

    async def concat_client(engine):
        client = ArealOpenAI(engine=engine, tokenizer=tok, chat_template_type="concat", tool_call_parser="qwen", reasoning_parser="qwen3")
        assert client.engine is engine
        messages = [{"role": "user", "content": "1+1?"}]
        first = await client.chat.completions.create(model="m", messages=messages, max_tokens=8)
        messages += [first.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "sure?"}]
        await client.chat.completions.create(model="m", messages=messages, max_tokens=8)
        client.set_final_reward(1.0)
        return client.export_interactions(style="concat")

    rows = _with_engine(tok, concat_client)
    reply_tokens = len(tok.encode("42", add_special_tokens=False)) + 1  # + <|im_end|>
    assert len(rows) == 1 and sum(next(iter(rows.values())).loss_mask) == 2 * reply_tokens  # one row holding both replies
    with pytest.raises(ValueError, match="chat_template_type"):
        _with_engine(tok, lambda engine: _bad_template(engine, tok))


async def _bad_template(engine, tok):
    from areal.experimental.openai import ArealOpenAI

    ArealOpenAI(engine=engine, tokenizer=tok, chat_template_type="jinja")


# ---- 2. configs ------------------------------------------------------------------------------

AREAL_SHAPED_YAML = """
experiment_name: x
trial_name: y
enable_offload: false
allocation_mode: sglang:d4p1t1+d4p1t1
cluster: {n_nodes: 1, n_gpus_per_node: 8, fileroot: FILEROOT, name_resolve: {type: nfs}}
rollout:
  backend: "sglang:d4p1t1"
  experiment_name: ${experiment_name}
  consumer_batch_size: ${train_dataset.batch_size}
  agent: {mode: inline, tool_call_parser: qwen25, reasoning_parser: qwen3, export_style: individual, turn_discount: 0.9}
gconfig: {n_samples: 4, max_new_tokens: 64, max_tokens: 256, temperature: 1.0}
actor:
  backend: "fsdp:d4p1t1"
  path: embedded
  dtype: bfloat16
  optimizer: {type: adam, lr: 2.0e-5, weight_decay: 0.01, lr_scheduler_type: constant, gradient_clipping: 1.0}
  kl_ctl: 0.1
  use_decoupled_loss: true
  reward_scaling: 10.0
  adv_norm: {mean_level: batch, std_level: batch}
ref:
  path: ${actor.path}
sglang: {context_length: 32768}
vllm: {max_model_len: 32768}
train_dataset: {batch_size: 2, path: embedded, pin_memory: true, num_workers: 4}
saver: {freq_epochs: 1}
recover: {mode: disabled, freq_steps: 3, freq_secs: 600}
evaluator: {freq_epochs: 1}
stats_logger:
  experiment_name: ${experiment_name}
  trial_name: ${trial_name}
  fileroot: ${cluster.fileroot}
  wandb: {mode: disabled}
launcher: {trainer_port: 27015}
perf_tracer: {enabled: false}
"""


def test_areal_config_files_load_with_one_warning_naming_the_ignored_keys(tmp_path):
    from areal.api.cli_args import AReaLKeysIgnored, GRPOConfig, load_expr_config
    from areal.experimental.trainer import to_train_config

    path = tmp_path / "config.yaml"
    path.write_text(AREAL_SHAPED_YAML.replace("FILEROOT", str(tmp_path)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config, _ = load_expr_config(["--config", str(path), "~launcher", "gconfig.top_p=0.9"], GRPOConfig)
    ours = [w.message for w in caught if isinstance(w.message, AReaLKeysIgnored)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    ignored = ours[0].ignored
    for key in (
        "allocation_mode",
        "rollout.backend",
        "sglang",
        "vllm",
        "saver",
        "recover.freq_secs",
        "evaluator.freq_epochs",
        "ref",
        "actor.reward_scaling",
        "actor.adv_norm",
    ):
        assert key in ignored and ignored[key], key
    assert "launcher" not in ignored  # deleted on the command line
    assert "stats_logger.wandb" not in ignored and config.stats_logger.fileroot == str(tmp_path)  # mode: disabled, honoured
    assert config.rollout.backend == "embedded" and config.rollout.openai.mode == "inline"  # rollout.agent read as rollout.openai
    assert config.rollout.openai.reasoning_parser == "qwen3" and config.gconfig.top_p == 0.9
    tcfg = to_train_config(config, "m:A", 10, 0, True)
    t = tcfg.trainer
    assert (t.kl_coef, t.weight_decay, t.loss, t.turn_discount, t.lr) == (0.1, 0.01, "ppo", 0.9, 2e-5)
    assert tcfg.gateway.context_length == 256  # gconfig.max_tokens: prompt + sampled tokens of a call
    assert tcfg.logger == ["jsonl"] and tcfg.trainer.lr_scheduler == "constant"  # W&B disabled; AReaL's schedule
    assert (tcfg.recover.mode, tcfg.trainer.checkpoint_every) == ("off", 3)  # recover: honoured
    with pytest.raises(ValueError, match="no key"):
        load_expr_config(["--config", str(path), "~nothing.here"], GRPOConfig)


# ---- 3. grouping -----------------------------------------------------------------------------


class _OneTrajectory:
    """AReaL's current style: one client (one trajectory) per arun_episode call."""

    def __init__(self, tok):
        self.tok, self.calls, self.rewards = tok, 0, itertools.cycle([0.0, 1.0])

    async def arun_episode(self, engine, data):
        from areal.experimental.openai import ArealOpenAI

        self.calls += 1
        client = ArealOpenAI(engine=engine, tokenizer=self.tok)
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": data["q"]}], max_tokens=4)
        client.set_final_reward(next(self.rewards))
        return client.export_interactions()


class _WholeGroup(_OneTrajectory):
    """AReaL's older style: the call samples n_samples clients itself."""

    async def arun_episode(self, engine, data):
        rows = {}
        for _ in range(3):
            rows.update(await super().arun_episode(engine, data))
        self.calls -= 2
        return rows


class _FailsFirst(_WholeGroup):
    """The older style, whose first call fails (as an agent SDK does on a tool name the model made up)."""

    async def arun_episode(self, engine, data):
        if not self.calls:
            self.calls += 1
            raise RuntimeError("Tool string not found in agent Calculator Agent")
        return await super().arun_episode(engine, data)


def test_workflow_grouping_follows_both_areal_styles(tok):
    from areal.agent.groups import WorkflowGrouping

    async def run(engine):
        per_call, whole = _OneTrajectory(tok), _WholeGroup(tok)
        g1, g2 = WorkflowGrouping(per_call, 4, 30.0, [-1, 1]), WorkflowGrouping(whole, 4, 30.0, [-1, 1])
        a = [await g1.run_group(engine, {"q": "2+2?"}, f"a{i}") for i in range(2)]
        b = [await g2.run_group(engine, {"q": "2+2?"}, f"b{i}") for i in range(2)]
        failing = _FailsFirst(tok)
        g3 = WorkflowGrouping(failing, 4, 30.0, [-1, 1])
        c = [await g3.run_group(engine, {"q": "2+2?"}, f"c{i}") for i in range(2)]
        return per_call, whole, g1, g2, a, b, failing, g3, c

    per_call, whole, g1, g2, a, b, failing, g3, c = _with_engine(tok, run)
    assert g1.calls_per_group == 4 and per_call.calls == 8  # n_samples calls per prompt, as AReaL makes them
    assert all(len(calls) == 4 and all(c.clients == 1 for c in calls) for calls in a)
    assert {r.reward for c in a[0] for r in c.rows.values()} == {0.0, 1.0}  # a group with signal
    assert g2.calls_per_group == 1 and whole.calls == 2  # the call is the group: not n_samples² trajectories
    assert all(len(calls) == 1 and calls[0].clients == 3 and len(calls[0].rows) == 3 for calls in b)
    # a first call that fails decides nothing: the next one does, and the group is that one call's
    assert g3.calls_per_group == 1 and failing.calls == 3
    assert [x.outcome.status for x in c[0]] == ["error", "ok"] and not c[0][0].rows and c[0][1].clients == 3
    assert [len(calls) for calls in c] == [2, 1]


def test_steps_whose_groups_cannot_train_are_reported():
    from areal.agent.groups import AdvantageWatch
    from areal.protocol import TokenRow, Trajectory

    def traj(group: str, reward: float) -> Trajectory:
        row = TokenRow(input_ids=[1, 2], loss_mask=[0, 1], logprobs=[0.0, -1.0], versions=[-1, 0], reward=reward)
        return Trajectory.from_rows(episode_id=f"{group}-{reward}", group_id=group, group_size=1, reward=reward, status="ok", rows=[row])

    said: list[str] = []
    watch = AdvantageWatch(groups_per_step=2, n_samples=1, write=said.append)
    watch.add("g0", [traj("g0", 1.0)])
    assert len(said) == 1 and "n_samples" in said[0]  # a one-sample group is reported at once
    watch.add("g1", [traj("g1", 0.0)])
    assert len(said) == 2 and "step 1" in said[1] and "trains nothing" in said[1]
    watch.add("g2", [traj("g2", 0.0), traj("g2", 1.0)])
    watch.add("g3", [traj("g3", 1.0), traj("g3", 1.0)])
    assert len(said) == 2 and watch.dead_steps == 1  # step 2 has a group with signal: no warning


# ---- 4. workflow_kwargs ----------------------------------------------------------------------


def test_workflow_kwargs_reach_agent_classes_in_both_modes():
    from areal.agent.spec import load_agent
    from areal.api.cli_args import GRPOConfig
    from areal.experimental.trainer import plan_workflow, to_train_config, with_workflow_temperatures

    areal_kwargs = dict(temperature=0.7, top_p=0.9, max_tokens=2048, max_completion_tokens=48, max_turns=3)
    for path in (
        "areal.workflow.openai.math_agent.MathAgent",
        "areal.workflow.openai.math_agent.MultiTurnMathAgent",
        "areal.workflow.openai.math_agent.MathToolAgent",
        "areal.workflow.anthropic.math_agent.MathAgent",
        "areal.workflow.langchain.math_agent.MathAgent",
        "areal.workflow.langchain.math_agent.MathToolAgent",
        "areal.workflow.openai_agent.math_agent.MathAgent",
    ):
        plan = plan_workflow(path, areal_kwargs)
        assert plan.spec and plan.kwargs == areal_kwargs and plan.obj is None, path
        tcfg = with_workflow_temperatures(
            to_train_config(GRPOConfig(), plan.spec, 10, 0, True, plan.kwargs), areal_kwargs, {"temperature": 0.6}
        )
        assert tcfg.rollout.agent_kwargs == areal_kwargs and tcfg.rollout.temperature == 0.7 and tcfg.data.eval_temperature == 0.6
        load_agent(tcfg.rollout.agent, tcfg.rollout.agent_kwargs)  # what the zygote and the inline runner build
    agent = plan_workflow("areal.workflow.openai.math_agent.MathAgent", areal_kwargs)
    from areal.workflow.openai.math_agent import MathAgent

    s = MathAgent(**areal_kwargs).sampling
    assert s.openai_args() == {"temperature": 0.7, "top_p": 0.9, "max_tokens": 48} and s.call_tokens(used=2030) == 18
    assert agent.kind == "agent"
    with pytest.raises(TypeError):
        MathAgent(top_k=3)  # an unknown kwarg is an error, never dropped


# ---- 5. the session in the URL path ----------------------------------------------------------


def test_session_in_the_url_path_reaches_that_session_only(tok):
    from areal.gateway import Gateway, GatewayConfig, serve_http

    async def run(engine):
        gateway = Gateway(engine, tok, GatewayConfig())
        runner, url = await serve_http(gateway)
        try:
            key, other = gateway.open_session("e1"), gateway.open_session("e2")
            async with httpx.AsyncClient() as http:
                # LangChain's hard-coded placeholder key, and a request with no key at all: the path names the session
                client = AsyncOpenAI(base_url=f"{url}/sessions/{key}/v1", api_key="placeholder", http_client=http, max_retries=0)
                await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
                r = await http.post(
                    f"{url}/sessions/{key}/v1/chat/completions",
                    json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
                )
                assert r.status_code == 200, r.text
                # an Anthropic SDK handed the OpenAI-style base URL appends its own /v1
                r = await http.post(
                    f"{url}/sessions/{key}/v1/v1/messages",
                    json={"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]},
                )
                assert r.status_code == 200, r.text
                bad = await http.post(
                    f"{url}/sessions/sk-areal-guess/v1/chat/completions",
                    json={"model": "m", "messages": []},
                    headers={"authorization": f"Bearer {other}"},
                )
                assert bad.status_code == 401  # the path's key wins; a wrong one opens nothing
            return len(gateway.sessions[key].interactions), len(gateway.sessions[other].interactions)
        finally:
            await runner.cleanup()

    assert _with_engine(tok, run) == (3, 0)


def test_inline_agents_get_the_session_in_their_base_url():
    from areal.agent.spec import InlineRunner

    seen = {}

    async def agent(data, base_url, api_key, http_client):
        seen.update(base_url=base_url, api_key=api_key)
        return 1.0

    async def go():
        runner = InlineRunner(agent, "http://127.0.0.1:9")
        await runner.run_episode("e", {}, "sk-areal-abc", 5.0)
        await runner.close()

    asyncio.run(go())
    assert seen == {"base_url": "http://127.0.0.1:9/sessions/sk-areal-abc/v1", "api_key": "sk-areal-abc"}


def test_an_inline_agent_that_builds_its_client_with_no_key_reaches_its_session(tok, monkeypatch):
    """AReaL's guide-era agents: AsyncOpenAI(base_url=..., http_client=...) and no key anywhere."""
    from areal.agent.spec import InlineRunner
    from areal.gateway import Gateway, GatewayConfig, serve_http

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    class GuideEraAgent:
        async def run(self, data, **extra_kwargs):
            client = AsyncOpenAI(base_url=extra_kwargs["base_url"], http_client=extra_kwargs["http_client"], max_retries=0)
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
            return 1.0

    async def run(engine):
        gateway = Gateway(engine, tok, GatewayConfig())
        http_runner, url = await serve_http(gateway)
        runner = InlineRunner(GuideEraAgent(), url)
        try:
            key = gateway.open_session("e")
            outcome = await runner.run_episode("e", {}, key, 30.0)
            return outcome.status, outcome.error, len(gateway.sessions[key].interactions)
        finally:
            await runner.close()
            await http_runner.cleanup()

    status, error, calls = _with_engine(tok, run)
    assert (status, calls) == ("ok", 1), error


def test_areal_openai_takes_a_call_without_a_model(tok):
    """AReaL's ArealOpenAI: chat.completions.create(messages=...) alone, as AReaL's scripts call it."""
    from areal.experimental.openai import ArealOpenAI

    async def run(engine):
        client = ArealOpenAI(engine=engine, tokenizer=tok)
        reply = await client.chat.completions.create(messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        return reply.choices[0].message.content is not None, len(client.interactions)

    assert _with_engine(tok, run) == (True, 1)


# ---- 7. MultiTurnMathAgent -------------------------------------------------------------------


def test_multi_turn_math_agent_retries_and_rewards_each_reply(tok):
    from areal.gateway import Gateway, GatewayConfig, serve_http
    from areal.workflow.openai.math_agent import MultiTurnMathAgent

    async def run(engine):
        gateway = Gateway(engine, tok, GatewayConfig())
        runner, url = await serve_http(gateway)
        try:
            key = gateway.open_session("e")
            async with httpx.AsyncClient() as http:
                agent = MultiTurnMathAgent(max_turns=3, max_tokens=8)
                rewards = await agent.run({"question": "6 * 7 + 1?", "answer": "43"}, base_url=f"{url}/v1", api_key=key, http_client=http)
            return rewards, gateway.sessions[key].interactions
        finally:
            await runner.cleanup()

    rewards, interactions = _with_engine(tok, run)
    assert list(rewards) == list(interactions) and len(rewards) == 3 and set(rewards.values()) == {0.0}  # "42" is wrong 3 times
    chain = list(interactions.values())
    assert chain[1].parent_id == chain[0].id and chain[2].parent_id == chain[1].id  # each retry extends the last


def test_max_tokens_as_areal_means_it_is_cut_to_what_fits(tok):
    from areal.gateway import Gateway, GatewayConfig, serve_http

    async def run(engine):
        codes = []
        for fit in (False, True):
            gateway = Gateway(engine, tok, GatewayConfig(context_length=64, max_tokens_cap=32, default_max_tokens=16, fit_max_tokens=fit))
            runner, url = await serve_http(gateway)
            key = gateway.open_session("e")
            async with httpx.AsyncClient() as http:
                body = {"model": "m", "max_tokens": 2048, "messages": [{"role": "user", "content": "hi"}]}
                r = await http.post(f"{url}/sessions/{key}/v1/chat/completions", json=body)
                codes.append(r.status_code)
            await runner.cleanup()
        return codes

    assert _with_engine(tok, run) == [400, 200]  # refused as OpenAI does; served within the context as AReaL does


# ---- 8. context -----------------------------------------------------------------------------


def _tool_prompt(tok, at_least: int) -> str:
    """A system prompt of tool descriptions, as tool and handoff agents send, of >= ``at_least`` tokens."""
    line = "Tool calculator: evaluate an arithmetic expression such as (12 + 7) * 3 - 4 and return its value.\n"
    text = line
    while len(tok.encode(text, add_special_tokens=False)) < at_least:
        text += line
    return text


def test_a_real_agents_prompt_reaches_the_embedded_engine_within_the_limit_it_holds(tmp_path):
    import json

    import openai

    from areal.config import TrainConfig
    from areal.controller.run_setup import gateway_config
    from areal.embedded import ensure_embedded_model
    from areal.embedded.config import EmbeddedConfig, ScriptedConfig
    from areal.engine.launch import launch_embedded_engine
    from areal.gateway import Gateway, GatewayConfig, serve_http

    assert EmbeddedConfig().max_positions >= 4096 and ScriptedConfig().max_positions >= 4096
    model_dir = ensure_embedded_model()
    positions = json.loads((model_dir / "config.json").read_text())["max_position_embeddings"]
    tok = AutoTokenizer.from_pretrained(model_dir)
    # what the run's gateway says: whatever was configured, never more than the engine's model holds
    config = gateway_config(TrainConfig(gateway=GatewayConfig(context_length=1 << 20)).gateway, model_dir, print)
    assert config.context_length == positions >= 4096

    async def go(url: str) -> tuple[int, int, dict, str]:
        engine = EngineClient(url)
        gateway = Gateway(engine, tok, config)
        runner, gw_url = await serve_http(gateway)
        try:
            key = gateway.open_session("e")
            async with httpx.AsyncClient(timeout=300) as http:
                client = AsyncOpenAI(base_url=f"{gw_url}/sessions/{key}/v1", api_key=key, http_client=http, max_retries=0)
                system = {"role": "system", "content": _tool_prompt(tok, 1300)}
                user = {"role": "user", "content": "What is 12 + 7?"}
                out = await client.chat.completions.create(model="m", messages=[system, user], max_tokens=8)
                with pytest.raises(openai.BadRequestError) as refused:  # past what the engine holds: the gateway's 400
                    await client.chat.completions.create(
                        model="m", messages=[{"role": "system", "content": _tool_prompt(tok, positions)}, user], max_tokens=8
                    )
            return out.usage.prompt_tokens, out.usage.completion_tokens, await engine.server_info(), str(refused.value)
        finally:
            await engine.close()
            await runner.cleanup()

    with launch_embedded_engine(str(model_dir)) as proc:
        prompt_tokens, completion_tokens, info, refusal = asyncio.run(go(proc.url))
    assert prompt_tokens >= 1300 and completion_tokens >= 1
    assert info["context_length"] == config.context_length  # the gateway advertises the engine's own limit
    assert f"context length of {positions}" in refusal


def test_areal_openai_in_a_run_keeps_the_runs_context_limit(tok):
    from areal import workflow_context
    from areal.experimental.openai import ArealOpenAI
    from areal.gateway import GatewayConfig

    run = GatewayConfig(context_length=96, max_tokens_cap=32, default_max_tokens=16)

    async def make(engine):
        outside = ArealOpenAI(engine=engine, tokenizer=tok)
        with workflow_context.calling(gateway=run):
            inside = ArealOpenAI(engine=engine, tokenizer=tok)
            capped = ArealOpenAI(engine=engine, tokenizer=tok, engine_max_tokens=10_000)
            messages = [{"role": "user", "content": "hi " * 200}]  # more than 96 tokens
            with pytest.raises(Exception, match="context length of 96"):
                await inside.chat.completions.create(model="m", messages=messages, max_tokens=8)
        return outside.gateway.config, inside.gateway.config, capped.gateway.config

    outside, inside, capped = _with_engine(tok, make)
    assert outside.context_length == GatewayConfig().context_length and outside.fit_max_tokens
    assert (inside.context_length, inside.max_tokens_cap, inside.default_max_tokens, inside.fit_max_tokens) == (96, 32, 16, True)
    assert capped.context_length == 96  # engine_max_tokens never beyond what the run's engine holds


@pytest.mark.e2e
def test_the_local_launcher_puts_the_users_directory_before_the_project(tmp_path, monkeypatch):
    """AReaL's scripts name their own ``examples.*`` workflows: run from AReaL's tree, those must
    load, not this project's files of the same dotted name."""
    from areal.launcher.local import PROJECT_ROOT, launch_env

    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text("experiment_name: e\ntrial_name: t\n")
    paths = launch_env(["x.py", "--config", "c.yaml"], base={"PYTHONPATH": "/extra"})["PYTHONPATH"].split(":")
    assert paths == [str(tmp_path), str(PROJECT_ROOT), "/extra"]
