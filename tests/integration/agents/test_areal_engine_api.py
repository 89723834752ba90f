"""AReaL's newest examples call the engine themselves (``engine.agenerate(ModelRequest)``): one test
per item of what they need, and a whole run of such a workflow trained as served.

Engine-backed tests use the instant stand-in engine (SGLang's /generate, always "42") with the
scripted model's tokenizer; the run uses the embedded model.
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
from instant_engine import with_instant_engine
from transformers import AutoTokenizer

from areal.embedded import ensure_scripted_model

WORKFLOWS = "areal_examples.countdown.workflows"


@pytest.fixture(scope="module")
def tok():
    return AutoTokenizer.from_pretrained(ensure_scripted_model())


_with_engine = with_instant_engine


def _data(tok):
    return {"messages": [{"role": "user", "content": "6*7?"}], "answer": "42"}


# ---- 1. engine.agenerate: recorded as the gateway records, trained as recorded -----------------


def test_agenerate_returns_the_recorded_tokens_and_the_rows_are_the_records(tok):
    from areal_examples.countdown.workflows import CountDownWorkflow

    from areal import workflow_context
    from areal.api import InferenceEngine, ModelRequest, ModelResponse
    from areal.api.cli_args import GenerationHyperparameters
    from areal.api.engine_api import GatewayEngine, RecordedWorkflow
    from areal.api.engine_api import ModelRequest as EngineModelRequest
    from areal.gateway.tree import InteractionWithTokenLogpReward

    assert EngineModelRequest is ModelRequest and issubclass(GatewayEngine, InferenceEngine)
    workflow = CountDownWorkflow(GenerationHyperparameters(max_new_tokens=16), tok)

    async def go(engine):
        with workflow_context.calling() as sessions:
            rows = await RecordedWorkflow(workflow).arun_episode(engine, _data(tok))
        facade = GatewayEngine(engine)
        resp = await facade.agenerate(ModelRequest(input_ids=[1, 2, 3], gconfig=GenerationHyperparameters(n_samples=1, max_new_tokens=4)))
        return rows, sessions, resp, facade

    rows, sessions, resp, facade = _with_engine(tok, go)
    assert isinstance(resp, ModelResponse) and resp.input_tokens == [1, 2, 3]
    answer = tok.encode("42", add_special_tokens=False)
    assert resp.output_tokens[: len(answer)] == answer and resp.output_len == len(resp.output_logprobs) == len(resp.output_versions)
    assert resp.stop_reason in ("stop", "length") and resp.output_versions == [0] * resp.output_len
    inter = facade.interactions[resp.interaction_id]  # the record is the response
    assert (inter.prompt_ids, inter.output_ids, inter.output_logprobs) == ([1, 2, 3], resp.output_tokens, resp.output_logprobs)
    # The workflow's tensor row became the recorded row, its reward set on the record too.
    (session,) = sessions  # one trajectory, one client: the controller calls it n_samples times
    ((rid, row),) = rows.items()
    assert isinstance(row, InteractionWithTokenLogpReward) and rid in session.interactions
    recorded = session.interactions[rid]
    assert row.input_ids == recorded.prompt_ids + recorded.output_ids
    assert row.loss_mask == [0] * len(recorded.prompt_ids) + [1] * len(recorded.output_ids)
    assert row.logprobs[len(recorded.prompt_ids) :] == recorded.output_logprobs
    assert row.reward == recorded.reward == float(len(recorded.output_ids) % 2)


def test_a_multi_turn_workflow_trains_its_turns_as_one_recorded_chain(tok):
    from areal_examples.countdown.workflows import TIRWorkflow

    from areal.api.cli_args import GenerationHyperparameters
    from areal.api.engine_api import GatewayEngine

    workflow = TIRWorkflow(GenerationHyperparameters(), tok)

    async def go(engine):
        facade = GatewayEngine(engine)
        result = await workflow.arun_episode(facade, _data(tok))
        return facade, result

    facade, result = _with_engine(tok, go)
    first, second = facade.interactions.values()
    assert second.parent_id == first.id and len(facade.sessions) == 1  # the second turn extends the first
    ((rid, row),) = facade.rows(result).items()
    assert rid == second.id
    tool = len(second.prompt_ids) - len(first.prompt_ids) - len(first.output_ids)
    assert tool > 0 and row.input_ids == second.prompt_ids + second.output_ids
    assert row.loss_mask == result["loss_mask"][0].tolist()  # both turns trained, the tool's tokens not
    assert sum(row.loss_mask) == len(first.output_ids) + len(second.output_ids)

    forged = {k: v.clone() for k, v in result.items()}
    forged["input_ids"][0, -2] += 1  # a token the engine never served
    with pytest.raises(ValueError, match="not a sequence the engine served"):
        facade.rows(forged)
    overtrained = {k: v.clone() for k, v in result.items()}
    overtrained["loss_mask"][0, :] = 1  # training the prompt and the tool's tokens
    with pytest.raises(ValueError, match="did not sample"):
        facade.rows(overtrained)


def test_agenerate_keeps_areals_limits(tok):
    from areal.api import ModelRequest
    from areal.api.cli_args import GenerationHyperparameters
    from areal.api.engine_api import GatewayEngine

    async def go(engine):
        facade = GatewayEngine(engine)
        with pytest.raises(ValueError, match="n_samples must be 1"):
            await facade.agenerate(ModelRequest(input_ids=[1], gconfig=GenerationHyperparameters(n_samples=2)))
        with pytest.raises(RuntimeError, match="non-positive"):
            await facade.agenerate(ModelRequest(input_ids=[1] * 8, gconfig=GenerationHyperparameters(n_samples=1, max_tokens=8)))
        return facade.interactions

    assert _with_engine(tok, go) == {}  # a refused call records nothing


def _traced(tok, style: str):
    from areal_examples.countdown.workflows import TracedWorkflow

    from areal.api.cli_args import GenerationHyperparameters
    from areal.api.engine_api import GatewayEngine

    workflow = TracedWorkflow(GenerationHyperparameters(), tok, style=style)

    async def go(engine):
        facade = GatewayEngine(engine)
        result = await workflow.arun_episode(facade, _data(tok))
        return facade, result, facade.rows(result)

    return _with_engine(tok, go)


def test_a_workflows_own_trace_in_areals_types_trains_the_recorded_chain(tok):
    """AReaL's scaffolding controllers trace their calls as ``InteractionWithTokenLogpReward``s in
    an ``InteractionCache``: the cache links the second call to the first by their messages, the
    concat export is the leaf, whose row holds both calls' sampled tokens; what trains is the
    recorded chain, with the discounted reward."""
    from areal.experimental.openai.types import ApiType, InteractionWithTokenLogpReward

    facade, exported, rows = _traced(tok, "concat")
    ((key, leaf),) = exported.items()
    assert key == "call-1" and isinstance(leaf, InteractionWithTokenLogpReward) and leaf.parent is not None
    assert leaf.parent.interaction_id == "call-0" and leaf.api_type is ApiType.NONE
    assert leaf.remaining_messages == [{"role": "user", "content": "Again?"}]
    first, second = facade.interactions.values()
    assert second.parent_id == first.id
    ((rid, row),) = rows.items()
    assert rid == second.id and row.input_ids == second.prompt_ids + second.output_ids
    assert sum(row.loss_mask) == len(first.output_ids) + len(second.output_ids)  # both calls' samples, nothing else
    assert row.reward == second.reward == float(len(second.output_ids) % 2)  # the last call's, undiscounted
    tensors = leaf.to_tensor_dict()
    assert tensors["loss_mask"][0].tolist() == row.loss_mask and tensors["rewards"].tolist() == [row.reward]


def test_each_call_of_a_traced_workflow_exported_individually_is_its_own_recorded_row(tok):
    """``individual`` export: every call a row of its own, matched to its recorded call and training
    that call's samples only (the second call's prompt re-rendered from the messages); the first's
    reward discounted from the second's (γ = 0.5), as AReaL's cache does it."""
    facade, exported, rows = _traced(tok, "individual")
    assert list(exported) == ["call-0", "call-1"]
    first, second = facade.interactions.values()
    assert set(rows) == {first.id, second.id}
    last = float(len(second.output_ids) % 2)
    assert rows[second.id].reward == last and rows[first.id].reward == 0.5 * last
    for inter in (first, second):
        assert rows[inter.id].input_ids == inter.prompt_ids + inter.output_ids
        assert sum(rows[inter.id].loss_mask) == len(inter.output_ids)


def test_a_traced_calls_tensor_dict_is_trained_as_recorded_and_a_forged_trace_is_refused(tok):
    from areal.api.engine_api import GatewayEngine
    from areal.api.io_struct import ModelResponse
    from areal.experimental.openai.cache import InteractionCache
    from areal.experimental.openai.types import InteractionWithTokenLogpReward

    facade, tensors, rows = _traced(tok, "tensor")
    ((rid, row),) = rows.items()
    assert rid == list(facade.interactions)[-1] and row.input_ids == tensors["input_ids"][0].tolist()
    forged = InteractionWithTokenLogpReward(model_response=ModelResponse(input_tokens=[1, 2], output_tokens=[3]), reward=1.0)
    with pytest.raises(ValueError, match="not a sequence the engine served"):
        GatewayEngine(object()).rows({"x": forged})
    forged.output_message_list, forged.interaction_id = [], "a"
    cache = InteractionCache()
    assert copy.deepcopy(cache) == {}  # an empty cache copies (controllers are cloned per episode)
    cache["a"] = forged
    with pytest.raises(ValueError, match="copied only empty"):
        copy.deepcopy(cache)
    with pytest.raises(ValueError, match="'concat' export needs every interaction"):
        cache.export_interactions("concat")  # forged is "hf": its template may change tokens between turns


# ---- 2. RLVRWorkflow, logging, apply_chat_template ---------------------------------------------


def test_rlvr_workflow_has_areals_signature_and_trains_what_it_sampled(tok):
    from areal.api.cli_args import GenerationHyperparameters
    from areal.api.engine_api import RecordedWorkflow
    from areal.utils import logging
    from areal.utils.hf_utils import apply_chat_template
    from areal.workflow.rlvr import RLVRWorkflow

    assert logging.getLogger("RLVRWorkflow").name == "RLVRWorkflow"
    messages = _data(tok)["messages"]
    ids = apply_chat_template(tok, messages, add_generation_prompt=True)  # a list whatever transformers returns
    text = apply_chat_template(tok, messages, tokenize=False, add_generation_prompt=True)
    assert isinstance(ids, list) and ids == tok.encode(text, add_special_tokens=False)
    workflow = RLVRWorkflow(
        reward_fn="areal.reward.gsm8k.gsm8k_reward_fn",
        gconfig=GenerationHyperparameters(max_new_tokens=8),
        tokenizer=tok,
        enable_thinking=False,
    )
    assert tok.eos_token_id in workflow.gconfig.stop_token_ids

    async def go(engine):
        return await RecordedWorkflow(workflow).arun_episode(engine, _data(tok))

    ((_, row),) = _with_engine(tok, go).items()
    assert row.reward == 1.0  # the instant engine answers 42
    assert tok.decode([t for t, m in zip(row.input_ids, row.loss_mask) if m], skip_special_tokens=True) == "42"


def test_a_workflows_rows_carry_their_own_fields_and_need_no_answer(tok, tmp_path):
    """AReaL's boba example trains on rows of ``prompt`` and ``solutions``, which its reward_fn
    reads: a workflow object's training rows reach it as given, with no ``answer``; the run's own
    agent (which scores with ``answer``) still refuses them, and held-out rows still need one."""
    from areal.api.cli_args import GenerationHyperparameters
    from areal.config import TrainConfig
    from areal.controller.loop import Controller
    from areal.workflow.rlvr import RLVRWorkflow

    rows = [{"prompt": "What is 6 * 7?", "solutions": ["\\boxed{42}"]}]
    workflow = RLVRWorkflow(reward_fn="areal.reward.gsm8k.gsm8k_reward_fn", gconfig=GenerationHyperparameters(), tokenizer=tok)
    run = Controller(TrainConfig(), tmp_path, agent=workflow, dataset=rows)
    assert run.dataset == [{**rows[0], "question": "What is 6 * 7?", "messages": [{"role": "user", "content": "What is 6 * 7?"}]}]
    countdown = [{"query": "<|im_start|>user\nReach 24 with 3, 5, 8<|im_end|>\n", "numbers": [3, 5, 8], "target": 24}]
    assert (
        Controller(TrainConfig(), tmp_path, agent=workflow, dataset=countdown).dataset == countdown
    )  # AReaL's countdown rows: no prompt field
    with pytest.raises(ValueError, match="dataset row 0 needs `messages`, `question` or `prompt`"):
        Controller(TrainConfig(), tmp_path, dataset=countdown)  # the run's own agent needs one
    with pytest.raises(ValueError, match="dataset row 0 has no `answer`; keys: \\['prompt', 'solutions'\\]"):
        Controller(TrainConfig(), tmp_path, dataset=rows)
    with pytest.raises(ValueError, match="dataset row 0 has no `answer`"):
        Controller(TrainConfig(), tmp_path, agent=workflow, dataset=rows, eval_dataset=rows)


# ---- 3. ArealOpenAI: engine.config.request_timeout, responses' max_completion_tokens -----------


def test_areal_openai_over_the_engine_api_reads_request_timeout_and_max_completion_tokens(tok):
    from areal.api.cli_args import InferenceEngineConfig
    from areal.api.engine_api import GatewayEngine
    from areal.experimental.openai import ArealOpenAI

    sent: list[dict] = []

    async def go(engine):
        generate = engine.generate

        async def spy(ids, params, *args, **kwargs):  # what the gateway asks the engine for
            sent.append(params)
            return await generate(ids, params, *args, **kwargs)

        engine.generate = spy
        client = ArealOpenAI(engine=GatewayEngine(engine, InferenceEngineConfig(request_timeout=123.0)), tokenizer=tok)
        timeout = client.engine.config.request_timeout  # AReaL's camel example reads it
        await client.responses.create(input="6*7?", max_completion_tokens=1)
        with pytest.raises(ValueError, match="cannot both be set"):
            await client.responses.create(input="6*7?", max_completion_tokens=1, max_output_tokens=2)
        return timeout, list(client.interactions.values())

    timeout, interactions = _with_engine(tok, go)
    assert timeout == 123.0
    (inter,) = interactions
    assert [p["max_new_tokens"] for p in sent] == [1]  # max_completion_tokens became max_output_tokens
    assert inter.prompt_ids and inter.output_ids  # recorded as any call through the client


# ---- 4. AReaL's default context ----------------------------------------------------------------


def test_an_unset_max_tokens_is_areals_default_capped_at_the_models_positions(tmp_path):
    from areal.api.cli_args import AREAL_MAX_TOKENS, GRPOConfig, load_expr_config
    from areal.controller.run_setup import gateway_config, hf_model_dir
    from areal.experimental.trainer import to_train_config

    config, _ = load_expr_config([], GRPOConfig)
    assert config.gconfig.max_tokens == AREAL_MAX_TOKENS == 32768 and config.rollout.context_length is None
    tcfg = to_train_config(config, None, 8, 0, True)
    assert tcfg.gateway.context_length == AREAL_MAX_TOKENS  # not 2,048
    model = hf_model_dir("embedded")
    positions = json.loads((model / "config.json").read_text())["max_position_embeddings"]
    assert gateway_config(tcfg.gateway, model, lambda _: None).context_length == min(positions, AREAL_MAX_TOKENS)
    set_config, _ = load_expr_config(["gconfig.max_tokens=300", "rollout.context_length=200"], GRPOConfig)
    assert to_train_config(set_config, None, 8, 0, True).gateway.context_length == 200  # what a config sets still holds


def test_without_a_valid_dataset_nothing_is_evaluated_during_training_as_in_areal(caplog):
    """AReaL's countdown script hands PPOTrainer no valid_dataset and its config sets
    evaluator.freq_steps: AReaL evaluates nothing then; here the setting becomes 0, said in a warning."""
    from areal.api.cli_args import GRPOConfig, load_expr_config
    from areal.experimental.trainer import to_train_config, without_evaluation

    config, _ = load_expr_config(["evaluator.freq_steps=10"], GRPOConfig)
    tcfg = to_train_config(config, None, 8, 0, False)
    assert tcfg.data.eval_every == 10
    with caplog.at_level("WARNING"):
        assert without_evaluation(tcfg).data.eval_every == 0
    assert "no valid_dataset was given" in caplog.text


# ---- a whole run: an AReaL workflow's tokens trained as the engine served them ----------------


def _trained_workflow_run(tmp_path, workflow: str, kwargs: dict):
    """Three steps of ``workflow`` (2 groups of 2 calls, inline, staleness bound 0) on the embedded
    model, checked trained as sampled (``run_checks``); (the plan, the published trajectories, the run dir)."""
    from run_checks import check_trained_as_sampled

    from areal.aio import run
    from areal.api.cli_args import GRPOConfig, load_expr_config
    from areal.controller.loop import train
    from areal.experimental.trainer import plan_workflow, to_train_config

    overrides = ["gconfig.n_samples=2", "gconfig.max_new_tokens=8", "train_dataset.batch_size=2", "rollout.openai.mode=inline"]
    config, _ = load_expr_config([*overrides, "total_train_steps=3", f"cluster.fileroot={tmp_path}"], GRPOConfig)
    plan = plan_workflow(workflow, {"gconfig": config.gconfig, "tokenizer": "embedded", **kwargs}, config.rollout)
    tcfg = to_train_config(config, plan.spec, 8, 0, True)
    tcfg = dataclasses.replace(
        tcfg,
        save_trajectories=True,
        engine=dataclasses.replace(tcfg.engine, request_log=True),
        rollout=dataclasses.replace(tcfg.rollout, max_head_offpolicyness=0),
    )
    run_dir = tmp_path / "run"
    run(train(tcfg, run_dir, agent=plan.obj))
    return plan, check_trained_as_sampled(run_dir), run_dir


@pytest.mark.e2e
def test_an_engine_level_workflow_trains_the_tokens_the_engine_served(tmp_path):
    _, published, run_dir = _trained_workflow_run(tmp_path, f"{WORKFLOWS}.CountDownWorkflow", {})
    assert {len(t.array("row_lens")) for t in published} == {1}  # one row per call: n_samples calls per group
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert episodes and all(e["status"] == "ok" for e in episodes)


def test_engine_addresses_outside_a_run_says_what_it_names(tok):
    from areal.api.engine_api import GatewayEngine

    with pytest.raises(RuntimeError, match="names the run's gateway"):
        GatewayEngine(object()).addresses  # noqa: B018 -- the property is what is tested


@pytest.mark.e2e
def test_a_scaffolding_workflows_own_client_on_engine_addresses_trains_the_tokens_the_engine_served(tmp_path):
    """AReaL's scaffolding shape: the workflow's own OpenAI client on ``engine.addresses[0]``, made
    at the first episode and kept for every later one, asks the Completions API with a prompt it
    rendered itself; each episode's row (its own prompt ids + the reply's ``token_ids``, placeholder
    logprobs) is matched to the call the gateway recorded and trained with the engine's logprobs,
    each call trained once."""
    kwargs = {"reward_fn": f"{WORKFLOWS}.token_parity_reward", "enable_thinking": False}
    plan, published, run_dir = _trained_workflow_run(tmp_path, "areal_examples.scaffolding.workflow.ScaffoldingWorkflow", kwargs)
    assert plan.obj.workflow.worker is not None  # one client, made at the first episode, served every later one
    rows = [t.array("row_lens") for t in published]
    assert rows and {len(r) for r in rows} == {1}
    episodes = [json.loads(line) for line in (run_dir / "episodes.jsonl").read_text().splitlines()]
    assert len(episodes) >= 6 and all(e["status"] == "ok" for e in episodes)


def test_the_workflow_door_serves_every_episode_and_each_call_is_claimed_once(tok):
    """``engine.addresses`` is one session of the run's gateway for the whole run (AReaL's clients
    keep the first address they get): a call made there is trained by the episode whose row holds
    its tokens, leaves the door with its ancestors, and cannot be claimed again; an expired door
    comes back under the same key, its unclaimed calls kept."""
    import asyncio

    from scripted_engine import ScriptedEngine

    from areal import workflow_context
    from areal.api.engine_api import GatewayEngine
    from areal.gateway.contract import Sampling
    from areal.gateway.core import Gateway

    gateway = Gateway(ScriptedEngine(tok, [("4", "<|im_end|>"), ("2", "<|im_end|>"), ("7", "<|im_end|>")]), tok)
    prompt = tok.encode("<|im_start|>user\n6*7?<|im_end|>\n<|im_start|>assistant\n")

    async def go():
        with workflow_context.calling(door=(gateway, "http://127.0.0.1:9")):
            first, second = GatewayEngine(object()), GatewayEngine(object())
            door = first._door
            assert first.addresses == second.addresses == [f"127.0.0.1:9/sessions/{door.key}"]
            (a,) = await gateway.complete_prompt(door.session, prompt, Sampling(max_tokens=4))
            root = door.session.interactions[a.interaction_id]
            (b,) = await gateway.complete_prompt(door.session, root.prompt_ids + root.output_ids, Sampling(max_tokens=4))
            (c,) = await gateway.complete_prompt(door.session, prompt, Sampling(max_tokens=4))  # another episode's call
            leaf = door.session.interactions[b.interaction_id]
            assert leaf.parent_id == root.id
            row = {"input_ids": [leaf.prompt_ids + leaf.output_ids], "loss_mask": [[0] * len(leaf.prompt_ids) + [1] * len(leaf.output_ids)]}
            rows = first.rows({**row, "rewards": [1.0]})
            assert list(rows) == [leaf.id] and rows[leaf.id].logprobs[-1] == -0.5  # the engine's logprob, not the row's
            assert set(door.session.interactions) == {c.interaction_id}  # the chain left the door, the other call stayed
            assert {i for s in first.sessions for i in s.interactions} == {root.id, leaf.id}
            with pytest.raises(ValueError, match="not a sequence the engine served"):
                second.rows({**row, "rewards": [0.0]})  # trained once
            gateway.expire_idle(now=door.session.last_used + 2 * gateway.config.session_idle_s)
            assert door.key not in gateway.sessions
            third = GatewayEngine(object())
            assert third.addresses == first.addresses and set(door.session.interactions) == {c.interaction_id}

    asyncio.run(go())
