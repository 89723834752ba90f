"""Failed episodes told apart (areal/agent/failures.py): the policy's, the agent's, the infrastructure's.

Per SDK, the exceptions are the SDKs' own, raised by their own code: the OpenAI, Anthropic,
LangChain and CAMEL clients against a real gateway whose engine is down (a prompt past the context
is refused before the engine is asked: a 400 naming the context; any other call gets the 503 of an
engine that does not answer), LangChain's parsers, tools and graphs, the OpenAI Agents SDK's tools
and runner; the general rule for exceptions named for the model's unusable output, whatever the
SDK; ``rollout.failure_classes`` before the built-in rules, in the controller's settling of an
episode. Then the sandbox (the class and the exception chain's names cross the zygote's pipe),
the failure-rate stop rule, and a short real run with an agent that fails in every class:
episodes.jsonl holds each class, policy failures reach the trainer with
``rollout.policy_failure_reward``, agent and infrastructure failures stay out of their group.
"""

from __future__ import annotations

import asyncio
import json
import socket

import httpx
import msgspec
import pytest
import zmq
from gateway_harness import GatewayThread
from run_checks import read_jsonl, run_in_repo, train_cmd

from areal.agent.failures import AGENT, INFRASTRUCTURE, POLICY, classify_exception, classify_outcome
from areal.agent.spec import outcome_from_exception
from areal.config import TrainConfig
from areal.controller.loop import Controller
from areal.controller.trajectories import read_saved_trajectories
from areal.dataclass_config import build_dataclass
from areal.protocol import EpisodeOutcome
from areal.trainer.step import compute_advantages

LONG = "word " * 5000  # past any context the gateway allows the test models


def _raised(fn, *args, **kwargs) -> BaseException:
    """The exception ``fn(*args, **kwargs)`` raises (a coroutine function is run)."""
    try:
        result = fn(*args, **kwargs)
        if asyncio.iscoroutine(result):
            asyncio.run(result)
    except BaseException as e:  # the object under test
        return e
    raise AssertionError(f"{fn} raised nothing")


def _dead_url() -> str:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture(scope="module")
def gateway():
    """A real gateway over an engine that is down: (gateway thread, a session key)."""
    from areal.embedded import ensure_scripted_model

    gw = GatewayThread(_dead_url(), ensure_scripted_model())
    yield gw, gw.open_session()
    gw.stop()


# ---- per SDK ------------------------------------------------------------------------------


def test_openai_sdk(gateway):
    import openai

    gw, key = gateway
    client = openai.OpenAI(base_url=f"{gw.http}/sessions/{key}/v1", api_key=key, max_retries=0)

    def ask(content: str) -> None:
        client.chat.completions.create(model="m", messages=[{"role": "user", "content": content}], max_tokens=8)

    overflow = _raised(ask, LONG)
    assert isinstance(overflow, openai.BadRequestError) and "exceeds the context length" in str(overflow)
    assert classify_exception(overflow) == (POLICY, "context overflow: openai.BadRequestError (HTTP 400)")
    engine_down = _raised(ask, "hi")
    assert isinstance(engine_down, openai.InternalServerError)
    assert classify_exception(engine_down) == (INFRASTRUCTURE, "openai.InternalServerError (HTTP 503)")
    wrong_key = openai.OpenAI(base_url=f"{gw.http}/v1", api_key="sk-not-a-session", max_retries=0)
    refused = _raised(wrong_key.chat.completions.create, model="m", messages=[{"role": "user", "content": "hi"}])
    assert classify_exception(refused) == (AGENT, "openai.AuthenticationError (HTTP 401)")
    unreachable = openai.OpenAI(base_url=f"{_dead_url()}/v1", api_key=key, max_retries=0)
    gone = _raised(unreachable.chat.completions.create, model="m", messages=[{"role": "user", "content": "hi"}])
    assert classify_exception(gone) == (INFRASTRUCTURE, "openai.APIConnectionError")
    # The model's answer cut at max_tokens where the agent needed it whole: the SDK's own check.
    cut = openai.LengthFinishReasonError(completion=openai.types.chat.ChatCompletion.model_validate(_LENGTH_COMPLETION))
    assert classify_exception(cut) == (POLICY, "openai.LengthFinishReasonError")


_LENGTH_COMPLETION = {
    "id": "c",
    "object": "chat.completion",
    "created": 0,
    "model": "m",
    "choices": [{"index": 0, "finish_reason": "length", "message": {"role": "assistant", "content": '{"a": '}}],
}


def test_anthropic_sdk(gateway):
    import anthropic

    gw, key = gateway
    client = anthropic.Anthropic(base_url=f"{gw.http}/sessions/{key}", api_key=key, max_retries=0)

    def ask(content: str) -> None:
        client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": content}])

    overflow = _raised(ask, LONG)
    assert isinstance(overflow, anthropic.BadRequestError)
    assert classify_exception(overflow) == (POLICY, "context overflow: anthropic.BadRequestError (HTTP 400)")
    engine_down = _raised(ask, "hi")
    assert isinstance(engine_down, anthropic.InternalServerError)
    assert classify_exception(engine_down)[0] == INFRASTRUCTURE
    unreachable = anthropic.Anthropic(base_url=_dead_url(), api_key=key, max_retries=0)
    gone = _raised(unreachable.messages.create, model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
    assert classify_exception(gone) == (INFRASTRUCTURE, "anthropic.APIConnectionError")


def test_langchain(gateway):
    from langchain_core.messages import AIMessage
    from langchain_core.output_parsers import JsonOutputParser
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    gw, key = gateway
    chat = ChatOpenAI(base_url=f"{gw.http}/sessions/{key}/v1", api_key=key, model="m", max_retries=0)
    assert classify_exception(_raised(chat.invoke, LONG))[0] == POLICY
    assert classify_exception(_raised(chat.invoke, "hi"))[0] == INFRASTRUCTURE
    parse = _raised(JsonOutputParser().parse, "the answer is {42")
    assert classify_exception(parse) == (POLICY, "langchain_core.exceptions.OutputParserException")

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @tool
    def broken(a: int) -> int:
        """A tool with a bug of its own."""
        return {"a": a}["b"]

    # The model's arguments fail the tool's schema: pydantic raises inside LangChain's validation.
    bad_args = _raised(add.invoke, {"a": "seven", "b": 1})
    assert classify_exception(bad_args)[0] == POLICY
    assert "tool input" in classify_exception(bad_args)[1]
    assert classify_exception(_raised(broken.invoke, {"a": 1})) == (AGENT, "builtins.KeyError")
    # The agent's own pydantic model refusing the agent's own data is the agent's.
    from pydantic import BaseModel

    class Config(BaseModel):
        n: int

    assert classify_exception(_raised(Config, n="many"))[0] == AGENT
    # LangGraph's ToolNode (handle_tool_errors off) and its turn limit.
    graph = StateGraph(MessagesState)
    graph.add_node("tools", ToolNode([add], handle_tool_errors=False))
    graph.add_edge(START, "tools")
    graph.add_edge("tools", END)
    call = AIMessage(content="", tool_calls=[{"name": "add", "args": {"a": "seven", "b": 1}, "id": "1"}])
    invocation = _raised(graph.compile().invoke, {"messages": [call]})
    assert classify_exception(invocation) == (POLICY, "langgraph.prebuilt.tool_node.ToolInvocationError")
    loop = StateGraph(MessagesState)
    loop.add_node("think", lambda state: {"messages": [AIMessage(content="again")]})
    loop.add_edge(START, "think")
    loop.add_edge("think", "think")
    limit = _raised(loop.compile().invoke, {"messages": []}, {"recursion_limit": 3})
    assert classify_exception(limit) == (POLICY, "langgraph.errors.GraphRecursionError")


def test_openai_agents_sdk():
    import openai

    from agents import Agent, OpenAIProvider, RunConfig, Runner, function_tool

    @function_tool(failure_error_function=None)  # raise, as an agent that handles no tool error does
    def multiply(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    async def call_with(arguments: str) -> None:
        from agents.tool_context import ToolContext

        await multiply.on_invoke_tool(
            ToolContext(context=None, tool_name="multiply", tool_call_id="1", tool_arguments=arguments), arguments
        )

    assert classify_exception(_raised(call_with, '{"a": 6, "b"')) == (POLICY, "agents.exceptions.ModelBehaviorError")
    assert classify_exception(_raised(call_with, '{"a": "six", "b": 7}')) == (POLICY, "agents.exceptions.ModelBehaviorError")
    client = openai.AsyncOpenAI(base_url=f"{_dead_url()}/v1", api_key="x", max_retries=0)
    config = RunConfig(model_provider=OpenAIProvider(openai_client=client), tracing_disabled=True)
    agent = Agent(name="Solver", instructions="Solve it.")
    turns = _raised(Runner.run, agent, "2+2?", run_config=config, max_turns=0)
    assert classify_exception(turns) == (POLICY, "agents.exceptions.MaxTurnsExceeded")
    unreachable = _raised(Runner.run, agent, "2+2?", run_config=config, max_turns=2)
    assert classify_exception(unreachable) == (INFRASTRUCTURE, "openai.APIConnectionError")
    # The unknown-tool ModelBehaviorError from the runner itself is in the end-to-end run below.


def test_camel(gateway):
    import openai
    from camel.agents import ChatAgent

    from areal.embedded import ensure_scripted_model
    from areal.experimental.camel.openai_model import AReaLOpenAICompatibleModel
    from areal.utils.hf_utils import load_hf_tokenizer

    gw, key = gateway
    tokenizer = load_hf_tokenizer(str(ensure_scripted_model()))

    async def step(text: str) -> None:
        client = openai.AsyncOpenAI(base_url=f"{gw.http}/sessions/{key}/v1", api_key=key, max_retries=0)
        model = AReaLOpenAICompatibleModel(
            openai_client=client, tokenizer=tokenizer, model_type="areal", model_config_dict={"max_tokens": 8}
        )
        await ChatAgent(system_message="You add numbers.", model=model, retry_attempts=1).astep(text)

    assert classify_exception(_raised(step, LONG))[0] == POLICY
    assert classify_exception(_raised(step, "2+2?"))[0] == INFRASTRUCTURE


def test_json_decode_errors_and_chains():
    tool_arguments = _raised(json.loads, '{"expression": "6*7"')
    assert classify_exception(tool_arguments) == (POLICY, "json.decoder.JSONDecodeError")
    # Wrapped: the outermost exception a rule knows decides (here the cause, an infrastructure one).
    try:
        try:
            raise httpx.ConnectError("refused")
        except httpx.ConnectError as e:
            raise RuntimeError("could not reach the model") from e
    except RuntimeError as e:
        assert classify_exception(e) == (INFRASTRUCTURE, "httpx.ConnectError")
    group = ExceptionGroup("tasks", [ValueError("mine"), json.JSONDecodeError("bad", "{", 1)])
    assert classify_exception(group) == (POLICY, "json.decoder.JSONDecodeError")
    assert classify_exception(ValueError("a bug")) == (AGENT, "builtins.ValueError")


def _named(qualified: str, base: type[Exception] = Exception) -> type[Exception]:
    """An exception class with the qualified name an SDK gives it (the SDK is not installed here)."""
    module, _, name = qualified.rpartition(".")
    return type(name, (base,), {"__module__": module, "__qualname__": name})


def test_exceptions_named_for_the_models_unusable_output_are_the_policys_whatever_the_sdk():
    from langchain.agents.structured_output import MultipleStructuredOutputsError
    from langchain_core.messages import AIMessage

    # LangChain's create_agent: the model answered two structured responses where one was asked.
    twice = MultipleStructuredOutputsError(["Answer", "Answer"], AIMessage(content=""))
    assert classify_exception(twice) == (
        POLICY,
        "langchain.agents.structured_output.MultipleStructuredOutputsError (the model's output unusable)",
    )
    for name in (
        "dspy.utils.exceptions.AdapterParseError",
        "smolagents.utils.AgentParsingError",
        "pydantic_ai.exceptions.UnexpectedModelBehavior",
        "instructor.core.exceptions.IncompleteOutputException",
        "llama_index.core.output_parsers.base.OutputParserException",
    ):
        assert classify_exception(_named(name)("bad answer")) == (POLICY, f"{name} (the model's output unusable)")
    # A subclass of such a class (the SDK's own refinements) too; a parse error naming no model output is the agent's.
    assert classify_exception(_named("mysdk.StrictAdapterParseError", _named("dspy.AdapterParseError"))("x"))[0] == POLICY
    import xml.etree.ElementTree as ET

    assert classify_exception(_raised(ET.fromstring, "<answer>")) == (AGENT, "xml.etree.ElementTree.ParseError")
    assert classify_exception(_named("dateutil.parser.ParserError", ValueError)("x"))[0] == AGENT


def test_rollout_failure_classes_decide_before_the_built_in_rules():
    import xml.etree.ElementTree as ET

    parse = outcome_from_exception("e", _raised(ET.fromstring, "<a>"), 0.1)
    assert parse.raised[0][:2] == ["xml.etree.ElementTree.ParseError", "builtins.SyntaxError"]
    assert classify_outcome(parse, True).failure_class == AGENT
    # A base class's name covers its subclasses; the cause names the key that decided.
    by_base = classify_outcome(parse, True, {"builtins.SyntaxError": POLICY})
    assert (by_base.failure_class, by_base.failure_cause) == (
        POLICY,
        "xml.etree.ElementTree.ParseError (rollout.failure_classes: builtins.SyntaxError)",
    )
    # Before the built-in rules, on the whole chain: the inner cause's key wins over the outer's rule.
    try:
        try:
            raise _named("dspy.utils.exceptions.AdapterParseError", ValueError)("no answer field")
        except ValueError as e:
            raise httpx.ConnectError("gone") from e
    except httpx.ConnectError as e:
        chained = outcome_from_exception("e", e, 0.1)
    assert classify_outcome(chained, True).failure_class == INFRASTRUCTURE
    overruled = classify_outcome(chained, True, {"dspy.utils.exceptions.AdapterParseError": AGENT})
    assert (overruled.failure_class, overruled.failure_cause) == (
        AGENT,
        "dspy.utils.exceptions.AdapterParseError (rollout.failure_classes: dspy.utils.exceptions.AdapterParseError)",
    )
    # Only an exception the episode raised: a timeout stays the infrastructure's.
    assert classify_outcome(EpisodeOutcome("e", "timeout"), True, {"builtins.SyntaxError": POLICY}).failure_class == INFRASTRUCTURE


def test_the_controller_settles_an_inline_episode_with_rollout_failure_classes():
    """The inline runner's outcome settled as the controller settles every episode: the run's
    rollout.failure_classes makes it a policy failure, with rollout.policy_failure_reward."""
    from areal.agent.spec import InlineRunner
    from areal.config import RolloutConfig
    from areal.controller.episodes import Episodes
    from areal.gateway import Session

    async def agent(data):
        raise _named("dspy.utils.exceptions.AdapterParseError", ValueError)("no [[ ## answer ## ]] field")

    async def go() -> tuple[EpisodeOutcome, EpisodeOutcome]:
        runner = InlineRunner(agent, _dead_url())
        try:
            outcome = await runner.run_episode("e", {}, "sk-areal-unused-0000", 5.0)
        finally:
            await runner.close()
        session = Session(key="", episode_id="e")
        settled = []
        for classes in ({}, {"builtins.ValueError": POLICY}):
            rollout = RolloutConfig(failure_classes=classes, policy_failure_reward=-0.5)
            episodes = Episodes(runner, None, rollout, None, "", None, print, print)
            settled.append(await episodes.settle(outcome, session, {}))
        return settled[0], settled[1]

    built_in, configured = asyncio.run(go())
    assert (built_in.failure_class, built_in.failure_cause) == (
        POLICY,
        "dspy.utils.exceptions.AdapterParseError (the model's output unusable)",
    )
    assert configured.failure_class == POLICY and configured.reward == -0.5
    assert configured.failure_cause == "dspy.utils.exceptions.AdapterParseError (rollout.failure_classes: builtins.ValueError)"


def test_rollout_failure_classes_are_checked_naming_the_key():
    with pytest.raises(
        ValueError, match=r"rollout.failure_classes\['dspy.utils.exceptions.AdapterParseError'\] must be one of policy, agent"
    ):
        build_dataclass(TrainConfig, {"rollout": {"failure_classes": {"dspy.utils.exceptions.AdapterParseError": "model"}}})
    with pytest.raises(ValueError, match="rollout.failure_classes key 'AdapterParseError' must be an exception's qualified name"):
        build_dataclass(TrainConfig, {"rollout": {"failure_classes": {"AdapterParseError": "policy"}}})
    cfg = build_dataclass(TrainConfig, {"rollout": {"failure_classes": {"dspy.utils.exceptions.AdapterParseError": "policy"}}})
    assert cfg.rollout.failure_classes == {"dspy.utils.exceptions.AdapterParseError": POLICY}


def test_outcome_rules():
    ok = EpisodeOutcome("e", "ok", reward=1.0)
    assert (classify_outcome(ok, True).failure_class, classify_outcome(ok, False).failure_class) == ("", AGENT)
    for status in ("timeout", "crashed", "oom", "cancelled"):
        assert classify_outcome(EpisodeOutcome("e", status), True).failure_class == INFRASTRUCTURE
    overflow = outcome_from_exception("e", _overflow_error(), 0.1)
    assert classify_outcome(overflow, True).failure_class == POLICY  # its outputs filled the context
    first = classify_outcome(overflow, False)  # the prompt alone was too long: not the policy's doing
    assert first.failure_class == AGENT and "before the model answered once" in first.failure_cause
    # An error no runner classified (a lying reward, a reward function that raised) is the agent's;
    # a class that is not one of the three (an agent's outcome is its word) is too.
    assert classify_outcome(EpisodeOutcome("e", "error", error="bad reward"), True).failure_class == AGENT
    assert classify_outcome(EpisodeOutcome("e", "error", failure_class="nobody"), True).failure_class == AGENT


def _overflow_error() -> BaseException:
    import openai

    request = httpx.Request("POST", "http://gateway/v1/chat/completions")
    body = {
        "error": {"message": "prompt of 900 tokens plus max_tokens 256 exceeds the context length of 512", "type": "invalid_request_error"}
    }
    response = httpx.Response(400, json=body, request=request)
    return openai.BadRequestError(f"Error code: 400 - {body}", response=response, body=body)


# ---- the stop rule ------------------------------------------------------------------------


def test_the_failure_rate_counts_agent_and_infrastructure_failures_not_policy_ones(tmp_path):
    cfg = build_dataclass(TrainConfig, {"rollout": {"failure_window": 4, "max_failure_rate": 0.75}})
    c = Controller(cfg, tmp_path)

    def failed(cls: str, n: int) -> list[EpisodeOutcome]:
        return [EpisodeOutcome(f"{cls}{i}", "error", error=f"{cls} went wrong", failure_class=cls, failure_cause=cls) for i in range(n)]

    c._count_failures(failed(POLICY, 8))  # a policy that always fails is trained on, never stopped
    assert c.failure is None
    c._count_failures(failed(AGENT, 1) + failed(INFRASTRUCTURE, 1))
    assert c.failure is None  # 2 of 4
    c._count_failures(failed(INFRASTRUCTURE, 1))
    assert c.failure.startswith("3 of the last 4 episodes failed (rollout.max_failure_rate=0.75): infrastructure 2, agent 1")
    assert "e.g. infrastructure failure (infrastructure): status=error error=infrastructure went wrong" in c.failure


# ---- the sandbox --------------------------------------------------------------------------

SANDBOXED = """
import json

import openai


async def run(data, **kw):
    if data["case"] == "tool_arguments":
        from agents.util._json import validate_json
        from pydantic import TypeAdapter

        validate_json('{"a": ', TypeAdapter(dict), partial=False)  # the SDK's own check of tool arguments
    if data["case"] == "unreachable":
        client = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="x", max_retries=0)
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
    if data["case"] == "adapter_parse":
        AdapterParseError = type("AdapterParseError", (ValueError,), {"__module__": "dspy.utils.exceptions"})
        raise AdapterParseError("the model's reply fills no [[ ## answer ## ]] field")  # as DSPy's adapters say it
    if data["case"] == "xml":
        import xml.etree.ElementTree as ET

        ET.fromstring("<answer>")  # ParseError: by the built-in rules, the agent's
    return {"a": 1}["b"]
"""


def test_the_class_crosses_the_sandbox(tmp_path):
    from sandbox.isolation import SandboxConfig
    from sandbox.zygote_client import Zygote

    (tmp_path / "sandboxed.py").write_text(SANDBOXED)

    gateway = zmq.Context.instance().socket(zmq.ROUTER)  # the episodes' one way out; these agents never use it
    gateway.bind(f"ipc://{tmp_path}/gateway.sock")

    async def go() -> list[EpisodeOutcome]:
        z = await Zygote.start(
            f"{tmp_path / 'sandboxed.py'}:run", f"ipc://{tmp_path}/gateway.sock", SandboxConfig(), str(tmp_path / "logs")
        )
        try:
            return [
                await z.run_episode(case, {"case": case}, "sk-session-unused-000", 30.0)
                for case in ("tool_arguments", "unreachable", "bug", "adapter_parse", "xml")
            ]
        finally:
            await z.close()

    try:
        outcomes = asyncio.run(go())
    finally:
        gateway.close(0)
    assert [(o.status, o.failure_class, o.failure_cause) for o in outcomes] == [
        ("error", POLICY, "agents.exceptions.ModelBehaviorError"),
        ("error", INFRASTRUCTURE, "openai.APIConnectionError"),
        ("error", AGENT, "builtins.KeyError"),
        ("error", POLICY, "dspy.utils.exceptions.AdapterParseError (the model's output unusable)"),
        ("error", AGENT, "xml.etree.ElementTree.ParseError"),
    ], [o.error[-500:] for o in outcomes]
    # The chain's names cross too: the controller's rollout.failure_classes decides from them.
    classes = {"builtins.SyntaxError": POLICY, "openai.APIConnectionError": AGENT}
    settled = [classify_outcome(o, True, classes) for o in outcomes]
    assert [s.failure_class for s in settled] == [POLICY, AGENT, AGENT, POLICY, POLICY]
    assert settled[4].failure_cause == "xml.etree.ElementTree.ParseError (rollout.failure_classes: builtins.SyntaxError)"


# ---- end to end ---------------------------------------------------------------------------

# One role per episode of a group (one group in flight at a time: the counter deals them in turn).
EVERY_CLASS = """
import itertools

import openai
from agents import Agent, ModelSettings, OpenAIProvider, RunConfig, Runner, function_tool

ROLES = ["ok", "unknown_tool", "own_overflow", "no_answer", "bug", "prompt_overflow", "gateway_gone"]
LONG = "word " * 5000
turn = itertools.count()


@function_tool
def add(a: int, b: int) -> int:
    \"\"\"Add two integers.\"\"\"
    return a + b


async def run(data, base_url, api_key, http_client):
    role = ROLES[next(turn) % len(ROLES)]
    client = openai.AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
    if role in ("unknown_tool", "no_answer"):
        # The scripted model calls `calculator` whatever tools it is offered: this agent has `add`.
        config = RunConfig(
            model_provider=OpenAIProvider(openai_client=client), model_settings=ModelSettings(temperature=0.0), tracing_disabled=True
        )
        agent = Agent(name="Adder", instructions="Use add.", tools=[add])
        await Runner.run(agent, data["question"], run_config=config, max_turns=4 if role == "unknown_tool" else 0)
        return 1.0
    question = LONG if role == "prompt_overflow" else data["question"]
    messages = [{"role": "user", "content": question}]
    first = await client.chat.completions.create(model="m", messages=messages, max_tokens=8, temperature=0.0)
    if role == "own_overflow":  # its answer kept in the history, the history grown past the context
        messages += [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": LONG}]
        await client.chat.completions.create(model="m", messages=messages, max_tokens=8)
    if role == "bug":
        return {"answer": 1.0}["reward"]
    if role == "gateway_gone":
        gone = openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key=api_key, max_retries=0)
        await gone.chat.completions.create(model="m", messages=messages, max_tokens=8)
    return 1.0
"""

EXPECTED = {  # role -> (class, cause head, completions recorded, trained)
    "ok": ("", "", 1, True),
    "unknown_tool": (POLICY, "agents.exceptions.ModelBehaviorError", 1, True),
    "own_overflow": (POLICY, "context overflow: openai.BadRequestError", 1, True),
    "no_answer": (POLICY, "agents.exceptions.MaxTurnsExceeded", 0, False),
    "bug": (AGENT, "builtins.KeyError", 1, False),
    "prompt_overflow": (AGENT, "context overflow: openai.BadRequestError", 0, False),
    "gateway_gone": (INFRASTRUCTURE, "openai.APIConnectionError", 1, False),
}
PENALTY = -0.25


@pytest.mark.e2e
def test_a_run_trains_policy_failures_and_leaves_the_others_out_of_their_group(tmp_path):
    (tmp_path / "every_class.py").write_text(EVERY_CLASS)
    run_dir, n = tmp_path / "run", len(EXPECTED)
    proc = run_in_repo(
        train_cmd(
            run_dir,
            f"rollout.agent={tmp_path / 'every_class.py'}:run",
            "model.path=scripted",
            "rollout.openai.mode=inline",
            "trainer.steps=2",
            "rollout.groups_per_step=1",
            f"rollout.n_samples={n}",
            f"rollout.max_concurrent_episodes={n}",
            "rollout.max_head_offpolicyness=0",
            f"rollout.policy_failure_reward={PENALTY}",
            "save_trajectories=true",
            "data.eval_size=0",
        ),
        timeout_s=600,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    episodes = read_jsonl(run_dir / "episodes.jsonl")
    groups: dict[str, list[dict]] = {}
    for e in episodes:
        groups.setdefault(e["group_id"], []).append(e)
    assert len(groups) == 2, groups.keys()
    role_of: dict[str, str] = {}  # each episode's role, told by its class and cause
    for e in episodes:
        roles = [r for r, (cls, cause, _, _) in EXPECTED.items() if e["failure_class"] == cls and e["failure_cause"].startswith(cause)]
        assert len(roles) == 1, e
        role_of[e["episode_id"]] = roles[0]
        assert (e["interactions"] > 0) == (EXPECTED[roles[0]][2] > 0), e
    for members in groups.values():
        assert sorted(role_of[e["episode_id"]] for e in members) == sorted(EXPECTED), members
    assert "Tool calculator not found in agent Adder" in next(e["error"] for e in episodes if role_of[e["episode_id"]] == "unknown_tool")
    assert all(e["reward"] == PENALTY for e in episodes if e["failure_class"] == POLICY)

    # What reached the trainer: the ok episode and the policy failures that have completions.
    trained = read_jsonl(run_dir / "trained_episodes-r0.jsonl")
    assert [t["step"] for t in trained] == [1, 2]
    for step in trained:
        assert sorted(role_of[e] for e in step["episodes"]) == sorted(r for r, (*_, t) in EXPECTED.items() if t), step
    saved = read_saved_trajectories(run_dir / "trajectories.bin")
    assert len(saved) == 6 and all(t.group_size == 3 for t in saved)
    assert {(role_of[t.episode_id], t.reward, t.failure_kind) for t in saved} == {
        ("ok", 1.0, ""),
        ("unknown_tool", PENALTY, POLICY),
        ("own_overflow", PENALTY, POLICY),
    }
    assert all(set(t.array("row_rewards").tolist()) == {t.reward} for t in saved)
    # Each group's statistics are over its three trained episodes: mean 1/6, not the 1/7 of seven.
    mean = (1.0 + 2 * PENALTY) / 3
    std = (((1.0 - mean) ** 2 + 2 * (PENALTY - mean) ** 2) / 3) ** 0.5
    for adv, t in zip(compute_advantages(saved, 1.0, 1e-6), saved):
        assert adv.tolist() == pytest.approx([(t.reward - mean) / (std + 1e-6)] * len(adv), abs=1e-5)

    # Per step: the trainer saw 3 trajectories with their rewards; the classes are counted.
    steps = read_jsonl(run_dir / "metrics.jsonl")
    for m in steps:
        assert m["trajectories"] == 3 and m["reward_mean"] == pytest.approx(mean, abs=1e-6), m
        assert (m["failures_policy"], m["failures_agent"], m["failures_infrastructure"]) == (3, 2, 1), m


def test_policy_failure_reward_is_checked_against_the_reward_range():
    with pytest.raises(ValueError, match="rollout.policy_failure_reward must be a number within rollout.reward_range"):
        build_dataclass(TrainConfig, {"rollout": {"reward_range": [0, 1], "policy_failure_reward": -1}})
    assert (
        msgspec.json.decode(msgspec.json.encode(EpisodeOutcome("e", "error", failure_class=POLICY)), type=EpisodeOutcome).failure_class
        == POLICY
    )
