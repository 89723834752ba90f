"""Why an episode failed: the policy, the agent or the infrastructure, and what training does with it.

    exception raised by run() ─► classify_exception ─► (class, cause) on the EpisodeOutcome,
                             └─► raised_types ─────► with the chain's qualified names (``raised``)
      (where the exception object is: the episode process in the sandbox, the inline runner, a
       RolloutWorkflow's group; all three cross the zygote pipe as strings)
    EpisodeOutcome + whether the model answered + rollout.failure_classes
      ─► classify_outcome (the controller, once per episode)
      ─► "" (not a failure) | "policy" | "agent" | "infrastructure"

What each class means for the run:

    class           trained?                                       group statistics   failure-rate stop
    policy          yes: its recorded completions, with reward     counted in them    not counted
                    ``rollout.policy_failure_reward``
                    (no completion recorded: nothing, counted)
    agent           no                                             left out           counted
    infrastructure  no                                             left out           counted
    reward_hack     rollout.reward_hack: "exclude": no; "penalty": as a policy failure, with
                    reward ``rollout.reward_hack_penalty``                            not counted

A group's advantage is normalised over the episodes it publishes (ok ones and policy failures with
completions; ``Trajectory.group_size`` says how many), so a left-out episode shifts nobody's
advantage. Every episode's class and cause are in ``episodes.jsonl`` (``failure_class``,
``failure_cause``) and each step's counts in ``metrics.jsonl`` (``failures_<class>``). The run
stops when agent and infrastructure failures make up ``rollout.max_failure_rate`` of the last
``rollout.failure_window`` episodes: policy failures are what RL learns from, not a reason to stop.

How the class is decided. Evidence of reward hacking first: an episode with a world
(sandbox/world.py) whose sandbox recorded a tripwire (``EpisodeOutcome.tripwires``: a protected
path or a test-runner hook written, the checks sought, the grader's run cut short; sandbox/grader.py)
of a kind in ``rollout.reward_hack_tripwires`` is ``reward_hack``, whatever its status; the cause
names the first such tripwire. It is evidence the sandbox witnessed, never the episode's word.
Then the outcome's status:

- ``timeout`` (the deadline passed: under load, a slow engine or gateway), ``crashed`` (died by a
  signal or exited without reporting: the sandbox cannot tell an agent's native crash from a kill),
  ``oom`` (the sandbox's memory limit), ``cancelled`` (the run stopped): infrastructure.
- ``ok`` with no model call recorded: agent (nothing to train; it never used the gateway).
- ``error`` not raised by run() (a reward that lies, no reward at all, the run's reward function
  raising, the sandbox failing to prepare the episode: the zygote marks that one infrastructure):
  agent unless marked.

For an exception, ``rollout.failure_classes`` decides first: a mapping from an exception's
qualified name to a class, for an SDK the rules below do not know or to overrule one of them
(``{"dspy.utils.exceptions.AdapterParseError": "policy"}``). Every exception of the chain (walked as
below, each over its MRO: a base class's name covers its subclasses) is looked up in it before any
rule; the cause names the key (``... (rollout.failure_classes: <key>)``). The controller applies it
to the names the episode reported (``EpisodeOutcome.raised``), so no runner, zygote or Ray worker
needs the setting.

Then the built-in rules: the chain is walked outermost first (the exception, then ``__cause__``,
then ``__context__``, then the members of an ``ExceptionGroup``), and the first exception one of
these rules recognises decides (so ``RuntimeError("call failed") from APIConnectionError`` is
infrastructure); an exception whose chain none recognises is the agent's own bug. Classes are
matched by qualified name over the MRO (subclasses count), so no SDK is imported here:

policy (the model's output made the agent fail)
- OpenAI Agents SDK: ``agents.exceptions.ModelBehaviorError`` (a call to a tool the agent does not
  have, tool arguments that are not valid JSON or fail the tool's schema, a handoff without input,
  no final output), ``MaxTurnsExceeded`` (the turn limit), ``OutputGuardrailTripwireTriggered`` and
  ``ToolInputGuardrailTripwireTriggered`` (a guardrail on the model's output or tool input).
- LangChain / LangGraph: ``langchain_core.exceptions.OutputParserException`` (the model's text does
  not parse), ``langgraph.prebuilt.tool_node.ToolInvocationError`` (tool arguments that fail the
  schema), ``langgraph.errors.GraphRecursionError`` (the turn limit, ``recursion_limit``), and a
  pydantic ``ValidationError`` raised where LangChain validates a tool's input
  (``langchain_core.tools``: ``tool.invoke`` with the model's arguments).
- OpenAI SDK: ``LengthFinishReasonError`` (``.parse`` on an answer cut at ``max_tokens``).
- ``json.JSONDecodeError``: the model's tool arguments or JSON answer do not parse. (An agent that
  decodes a malformed file of its own is misread as policy: the error does not say whose text it
  was.)
- The general rule, for any SDK: an exception whose class or a base of it is named for the model's
  output being unusable (``_OUTPUT_UNUSABLE``): an output parser's error (``OutputParserException``,
  ``OutputParseError``, ``OutputParsingError``), DSPy's ``AdapterParseError`` (the answer does not
  fill the signature's fields), smolagents' ``AgentParsingError``, LangChain's ``StructuredOutputError``
  and its subclasses (a response format the answer fails), pydantic-ai's ``UnexpectedModelBehavior``
  and the Agents SDK's ``ModelBehaviorError``, instructor's ``IncompleteOutputException`` (the answer
  cut at ``max_tokens``). Matched by name, not module, so a class of the agent's own so named is read
  as the policy's too: ``rollout.failure_classes`` overrules it. Plain parse errors (``ParseError``
  of a config or a date) name no model output and stay the agent's.
- A context overflow: an HTTP 400 whose message names the context (our gateway's "exceeds the
  context length of N", SGLang's and vLLM's "maximum context length", Anthropic's "prompt is too
  long"), from the OpenAI or Anthropic SDK (and the SDKs built on them: LangChain, CAMEL) or the
  gateway's own ``RequestError``: their messages carry the reply's text (httpx's
  ``HTTPStatusError`` does not, so a raw-httpx agent's 400 is the agent's). It is the policy's
  only when the model answered at least once in the episode (its outputs made the prompt long);
  before that the prompt alone is too long and it is the agent's.

infrastructure (nothing the model or the agent's code did)
- connection failures: ``openai.APIConnectionError`` / ``APITimeoutError``, Anthropic's, httpx's
  and httpx2's ``TransportError``, aiohttp's ``ClientConnectionError``, ``ConnectionError``, our
  engine client's ``EngineUnavailable``;
- HTTP 5xx (engine unavailable 503, engine error 502, gateway 500; any SDK's status error, or
  httpx's ``HTTPStatusError``), 408, and 429 from the
  gateway's door when the door as a whole is full (429 naming a ``*_per_session`` budget is the
  agent's: it sent too much at once); CAMEL's ``ModelProcessingError`` (its retries on 429 ran out).

agent: every other exception, and every other HTTP 4xx (a malformed request, a wrong key).

What is not covered: a policy failure the agent catches and turns into a reward itself (the
agent's reward stands); an SDK that reports a failure only in its log; text-only failures of
``exec:`` agents (a non-zero exit is the agent's).
"""

from __future__ import annotations

import collections
import itertools
import re
import types
from collections.abc import Collection, Iterator, Mapping

import msgspec

from areal.protocol import EpisodeOutcome

POLICY, AGENT, INFRASTRUCTURE, REWARD_HACK = "policy", "agent", "infrastructure", "reward_hack"
CLASSES = (POLICY, AGENT, INFRASTRUCTURE)  # what an exception or an episode's own report may be
OUTCOME_CLASSES = (*CLASSES, REWARD_HACK)  # and what the sandbox's evidence decides
REWARD_HACK_MODES = ("exclude", "penalty")  # rollout.reward_hack
CONTEXT_OVERFLOW = "context overflow"  # the head of a context overflow's cause (see classify_outcome)

_INFRASTRUCTURE_STATUSES = frozenset({"timeout", "crashed", "oom", "cancelled"})
_POLICY_TYPES = frozenset(
    {
        "agents.exceptions.ModelBehaviorError",
        "agents.exceptions.MaxTurnsExceeded",
        "agents.exceptions.OutputGuardrailTripwireTriggered",
        "agents.exceptions.ToolInputGuardrailTripwireTriggered",
        "langchain_core.exceptions.OutputParserException",
        "langgraph.prebuilt.tool_node.ToolInvocationError",
        "langgraph.errors.GraphRecursionError",
        "openai.LengthFinishReasonError",
        "json.decoder.JSONDecodeError",
    }
)
_INFRASTRUCTURE_TYPES = frozenset(
    {
        "openai.APIConnectionError",
        "anthropic.APIConnectionError",
        "httpx.TransportError",
        "httpx2.TransportError",
        "aiohttp.client_exceptions.ClientConnectionError",
        "builtins.ConnectionError",
        "areal.engine.client.EngineUnavailable",
        "camel.models.model_manager.ModelProcessingError",
    }
)
# Class names (any module) saying the model's output is unusable: the general policy rule above.
_OUTPUT_UNUSABLE = re.compile(
    r"(?:Output|Adapter|Agent)Pars(?:e|er|ing)(?:Error|Exception)"
    r"|StructuredOutput\w*(?:Error|Exception)"
    r"|(?:Unexpected)?ModelBehavior(?:Error|Exception)?"
    r"|IncompleteOutput(?:Error|Exception)"
)
RAISED_LIMIT, BASES_LIMIT = 16, 32  # exceptions of a chain and names of each that ``raised_types`` keeps
_VALIDATION_ERROR = "pydantic_core._pydantic_core.ValidationError"
_LANGCHAIN_TOOLS = "langchain_core.tools"
_CONTEXT_MESSAGE = re.compile(r"context length|context window|maximum context|context_length_exceeded|prompt is too long", re.I)


def classify_exception(exc: BaseException) -> tuple[str, str]:
    """``(class, cause)`` of an exception run() raised: the class by the rules of the module
    docstring, the cause naming the exception that decided (``agents.exceptions.ModelBehaviorError``,
    ``context overflow: openai.BadRequestError (HTTP 400)``, ...)."""
    for e in _chain(exc):
        names = [_qualified(c) for c in type(e).__mro__]
        name = names[0]
        if _POLICY_TYPES.intersection(names):
            return POLICY, name
        if _INFRASTRUCTURE_TYPES.intersection(names):
            return INFRASTRUCTURE, name
        if any(_OUTPUT_UNUSABLE.fullmatch(c.__name__) for c in type(e).__mro__):
            return POLICY, f"{name} (the model's output unusable)"
        if _VALIDATION_ERROR in names and _raised_in(e, _LANGCHAIN_TOOLS):
            return POLICY, f"{name} (tool input, in {_LANGCHAIN_TOOLS})"
        status = _http_status(e)
        if status is not None:
            return _http_class(status, str(e), name)
    return AGENT, f"{type(exc).__module__}.{type(exc).__qualname__}"


def raised_types(exc: BaseException) -> list[list[str]]:
    """The qualified names of the exceptions of ``exc``'s chain, outermost first, each followed by
    its bases' (its MRO without ``object``): what ``rollout.failure_classes`` is looked up in, by
    the controller, where the exception object is gone (a sandboxed episode's process)."""
    return [[_qualified(c) for c in type(e).__mro__[:-1]][:BASES_LIMIT] for e in itertools.islice(_chain(exc), RAISED_LIMIT)]


def classify_outcome(
    outcome: EpisodeOutcome,
    sampled: bool,
    failure_classes: Mapping[str, str] | None = None,
    hack_tripwires: Collection[str] | None = None,
) -> EpisodeOutcome:
    """``outcome`` with its ``failure_class`` and ``failure_cause`` decided; ``sampled``: the model
    answered at least once in the episode (the gateway recorded a completion); ``failure_classes``:
    ``rollout.failure_classes``, looked up in the exceptions the episode raised before the class its
    runner found; ``hack_tripwires``: the tripwire kinds that make an episode a reward hack
    (``rollout.reward_hack_tripwires``; None: every kind). An ok episode that the model answered
    is no failure (both fields empty)."""
    hack = next((t for t in outcome.tripwires if hack_tripwires is None or t.partition(":")[0] in hack_tripwires), None)
    if hack is not None:
        return msgspec.structs.replace(outcome, failure_class=REWARD_HACK, failure_cause=hack[:200])
    if outcome.status == "error" and failure_classes:
        for names in outcome.raised:
            key = next((n for n in names if n in failure_classes), None)
            if key is not None:
                cause = f"{names[0]} (rollout.failure_classes: {key})"
                return msgspec.structs.replace(outcome, failure_class=failure_classes[key], failure_cause=cause)
    if outcome.status == "ok":
        if sampled:
            return msgspec.structs.replace(outcome, failure_class="", failure_cause="")
        return msgspec.structs.replace(outcome, failure_class=AGENT, failure_cause="no model call recorded")
    if outcome.status in _INFRASTRUCTURE_STATUSES:
        return msgspec.structs.replace(outcome, failure_class=INFRASTRUCTURE, failure_cause=outcome.status)
    cls = outcome.failure_class if outcome.failure_class in CLASSES else AGENT
    cause = outcome.failure_cause or outcome.status
    if cls == POLICY and cause.startswith(CONTEXT_OVERFLOW) and not sampled:
        cls, cause = AGENT, f"{cause}, before the model answered once: the prompt alone is too long"
    return msgspec.structs.replace(outcome, failure_class=cls, failure_cause=cause)


def trained(outcome: EpisodeOutcome, reward_hack: str) -> bool:
    """Whether a classified episode is trained on (given completions to train): an ok one, a
    policy failure, and a reward hack when ``reward_hack`` (rollout.reward_hack) is "penalty"."""
    if outcome.failure_class == REWARD_HACK:
        return reward_hack == "penalty"
    return outcome.status == "ok" or outcome.failure_class == POLICY


def failure_rate_exceeded(window: collections.deque[str], outcomes: list[EpisodeOutcome], bound: float) -> str | None:
    """Add the classes of ``outcomes`` (classified) to ``window`` (the last ``rollout.failure_window``
    episodes' classes); the reason the run stops, once the window is full and its agent and
    infrastructure failures, the episodes the run could not train on, reach ``bound``
    (``rollout.max_failure_rate``) of it, naming each class's count and an example of the larger;
    else None. Policy failures are trained on: they never stop the run."""
    window.extend(o.failure_class for o in outcomes)
    counts = {c: sum(1 for k in window if k == c) for c in (INFRASTRUCTURE, AGENT)}
    lost = sum(counts.values())
    if len(window) < (window.maxlen or 0) or lost < bound * len(window):
        return None
    worst = max(counts, key=lambda c: counts[c])  # infrastructure first on a tie
    example = next((o for o in outcomes if o.failure_class == worst), None) or next(
        (o for o in outcomes if o.failure_class in counts), outcomes[0]
    )
    return (
        f"{lost} of the last {len(window)} episodes failed (rollout.max_failure_rate={bound}): "
        f"infrastructure {counts[INFRASTRUCTURE]}, agent {counts[AGENT]} (policy failures are trained on, not "
        f"counted); e.g. {example.failure_class or 'no'} failure ({example.failure_cause}): status={example.status} "
        f"error={example.error[-2000:] or 'no interactions recorded'}"
    )


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def _chain(exc: BaseException) -> Iterator[BaseException]:
    """The exception and every exception it wraps, outermost first, each once."""
    seen: set[int] = set()
    todo = [exc]
    while todo:
        e = todo.pop(0)
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        todo.extend(x for x in (e.__cause__, e.__context__) if x is not None)
        if isinstance(e, BaseExceptionGroup):
            todo.extend(e.exceptions)


def _raised_in(exc: BaseException, module_prefix: str) -> bool:
    """Whether the innermost Python frame of ``exc``'s traceback outside pydantic lies in a module
    under ``module_prefix`` (pydantic's own frames are where every ValidationError is raised)."""
    frames: list[types.FrameType] = []
    tb = exc.__traceback__
    while tb is not None:
        frames.append(tb.tb_frame)
        tb = tb.tb_next
    for frame in reversed(frames):
        module = frame.f_globals.get("__name__", "")
        if not module.startswith("pydantic"):
            return module.startswith(module_prefix)
    return False


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status an error reports: the SDKs' ``status_code``, httpx's ``response``, the
    gateway's and engine client's ``status``."""
    for value in (
        getattr(exc, "status_code", None),
        getattr(getattr(exc, "response", None), "status_code", None),
        getattr(exc, "status", None) if type(exc).__module__.startswith("areal.") else None,
    ):
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return None


def _http_class(status: int, message: str, name: str) -> tuple[str, str]:
    what = f"{name} (HTTP {status})"
    if status == 400 and _CONTEXT_MESSAGE.search(message):
        return POLICY, f"{CONTEXT_OVERFLOW}: {what}"
    if status >= 500 or status == 408 or (status == 429 and "_per_session" not in message):
        return INFRASTRUCTURE, what
    return AGENT, what
