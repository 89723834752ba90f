"""From a validated Turn and its prompt ids to recorded choices: engine calls, stop strings,
parsing, streaming, and the Interaction of each choice.

    Turn ─ validate_turn ─► PromptBuilder.build ─► n × engine.generate / generate_stream
         ─► cut at the first stop string ─► parse (tools, reasoning) ─► Interaction ─► Choice

Invariants:
- A choice's Interaction holds exactly the tokens the client was answered with: with a stop
  string, the ids up to and including the token that completed it (SGLang's own convention),
  with their engine logprobs; nothing after. A stream the client abandons records nothing.
- Streaming forwards each engine update as it arrives; text is held back only while it ends in
  an incomplete UTF-8 sequence or could be the start of a stop string.
- n choices are n engine requests (a seeded request gives choice i the seed + i), each its own
  Interaction with the same parent. The first to fail, or a cancelled request, cancels the
  others, which aborts them at the engine; so does the session's close (its tasks).
- Each Interaction says what its reply did with tools, for the run's statistics: the well-formed
  calls the agent received, the call markup the parser could not read, and whether its content
  uses a tool result of its history (``used_tool_result``).
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import TYPE_CHECKING, Any

from areal.gateway.assistant_turn import prefill_text
from areal.gateway.contract import Choice, ChoiceDelta, RequestError, Sampling, TokenLogprob, Turn, as_system, check_number, new_id
from areal.gateway.parsers import ParsedOutput, StreamParser, forced_tool_prefix, parse_output, takes_no_arguments
from areal.gateway.render import Prompt
from areal.gateway.tree import Interaction

if TYPE_CHECKING:
    from areal.gateway.core import Gateway, GatewayConfig, Session

_ROLES = ("system", "user", "assistant", "tool", "developer")
_MAX_STOPS = 4
_MAX_TOP_LOGPROBS = 20


def session_closed() -> RequestError:
    """The answer to a request of a session closed while it was served (its episode ended)."""
    return RequestError(
        401, "session closed while this request was served (its episode ended); its generation was aborted", kind="authentication_error"
    )


async def all_or_none(calls: list[Coroutine[Any, Any, Any]]) -> list[Any]:
    """Every call's result. The first failure, or this coroutine's cancellation, cancels the
    calls still running: each is an engine generation nobody would read."""
    tasks = [asyncio.ensure_future(c) for c in calls]
    try:
        return await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()  # a no-op on those that finished


def validate_turn(turn: Turn, config: GatewayConfig, renders_developer: bool = True) -> None:
    """Raise RequestError (naming the parameter) for anything the core cannot honour. Normalises
    ``turn.messages`` in place: text parts joined, and ``developer`` messages made system ones
    (``contract.as_system``) unless the chat template ``renders_developer`` (else it would drop them)."""
    msgs = turn.messages
    if not isinstance(msgs, list) or not msgs or not all(isinstance(m, dict) for m in msgs):
        raise RequestError(400, "messages must be a non-empty list of message objects", param="messages")
    if len(msgs) > config.max_messages:
        raise RequestError(400, f"{len(msgs)} messages exceed the limit of {config.max_messages}", param="messages")
    for i, m in enumerate(msgs):
        role = m.get("role")
        if role not in _ROLES:
            raise RequestError(400, f"messages[{i}].role must be system, developer, user, assistant or tool", param=f"messages[{i}].role")
        if role == "developer" and not renders_developer:
            m = msgs[i] = as_system(m)
        elif role == "tool" and not isinstance(m.get("tool_call_id"), str):
            raise RequestError(
                400, f"messages[{i}].tool_call_id: a tool message needs the id of the call it answers", param=f"messages[{i}].tool_call_id"
            )
        if not isinstance(m.get("content"), (str, list, type(None))):
            raise RequestError(400, f"messages[{i}].content must be a string or a list of parts", param=f"messages[{i}].content")
        if isinstance(m.get("content"), list):  # text parts are joined; the template takes strings
            m["content"] = _join_text_parts(m["content"], f"messages[{i}].content")
        calls = m.get("tool_calls")
        if calls is not None and not (
            isinstance(calls, list)
            and all(
                isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str) for c in calls
            )
        ):
            raise RequestError(400, f"messages[{i}].tool_calls must be a list of function calls", param=f"messages[{i}].tool_calls")
    check_sampling(turn.sampling, config)
    _validate_tools(turn, config)


def check_sampling(s: Sampling, config: GatewayConfig) -> None:
    """A 400 naming the parameter of ``s`` that is out of its range (every front-end's sampling)."""
    check_number("max_tokens", s.max_tokens, 1, config.max_tokens_cap, integer=True)
    check_number("temperature", s.temperature, 0.0, 2.0)
    check_number("top_p", s.top_p, 1e-9, 1.0)
    if s.top_k != -1:
        check_number("top_k", s.top_k, 1, 2**30, integer=True)
    check_number("min_p", s.min_p, 0.0, 1.0)
    check_number("repetition_penalty", s.repetition_penalty, 1e-9, 2.0)
    check_number("n", s.n, 1, config.max_n, integer=True)
    if s.seed is not None:
        check_number("seed", s.seed, -(2**63), 2**63 - 1, integer=True)
    if not isinstance(s.stop, list) or len(s.stop) > _MAX_STOPS or not all(isinstance(x, str) and x for x in s.stop):
        raise RequestError(400, f"stop must be a string or a list of at most {_MAX_STOPS} non-empty strings", param="stop")
    check_number("top_logprobs", s.top_logprobs, 0, _MAX_TOP_LOGPROBS, integer=True)
    if s.top_logprobs and not s.logprobs:
        raise RequestError(400, "top_logprobs needs logprobs=true", param="top_logprobs")


def _join_text_parts(parts: list, where: str) -> str:
    """``[{"type": "text", "text": ...}, ...]`` -> one string; any other part is a 400 naming it."""
    texts = []
    for j, part in enumerate(parts):
        if not (isinstance(part, dict) and part.get("type") in ("text", "input_text", "output_text") and isinstance(part.get("text"), str)):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise RequestError(
                400,
                f"{where}[{j}] must be a text part ({{'type': 'text', 'text': ...}}); got {kind!r}: this gateway serves text-only models",
                param=f"{where}[{j}]",
            )
        texts.append(part["text"])
    return "".join(texts)


def _validate_tools(turn: Turn, config: GatewayConfig) -> None:
    tools = turn.tools
    if tools is not None:
        if not isinstance(tools, list) or not all(
            isinstance(t, dict)
            and t.get("type") == "function"
            and isinstance(t.get("function"), dict)
            and isinstance(t["function"].get("name"), str)
            for t in tools
        ):
            raise RequestError(400, "tools must be a list of {type: function, function: {name, parameters}}", param="tools")
    choice = turn.tool_choice
    if choice in (None, "auto", "none"):
        return
    if choice != "required" and not (
        isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict)
    ):
        raise RequestError(
            400,
            f"tool_choice must be 'auto', 'none', 'required' or {{'type': 'function', 'function': {{'name': ...}}}}, got {choice!r}",
            param="tool_choice",
        )
    if not tools:
        raise RequestError(400, "tool_choice forces a tool call, but the request offers no tools", param="tool_choice")
    if config.tool_parser is None:
        raise RequestError(400, "tool_choice cannot force a call: this gateway has no tool-call format (tool_parser)", param="tool_choice")
    if isinstance(choice, dict):
        name = choice["function"].get("name")
        if not any(t["function"]["name"] == name for t in tools):
            raise RequestError(400, f"tool_choice names function {name!r}, which is not in tools", param="tool_choice")


def forced_text(turn: Turn, config: GatewayConfig) -> str:
    """Text the gateway writes for the model after the prompt (a validated turn): the opening of a
    tool call when ``tool_choice`` is "required" or names a function, else "". Its ids are part of
    the recorded prompt, never of the sampled output."""
    choice = turn.tool_choice
    if choice == "required":
        return forced_tool_prefix(config.tool_parser, None)  # type: ignore[arg-type]  (validated: not None)
    if isinstance(choice, dict):
        name = choice["function"]["name"]
        tool = next(t["function"] for t in turn.tools or () if t["function"]["name"] == name)
        return forced_tool_prefix(
            config.tool_parser,
            name,  # type: ignore[arg-type]
            no_arguments=takes_no_arguments(tool.get("parameters")),
        )
    return ""


def _parsers(turn: Turn, config: GatewayConfig) -> tuple[str | None, str]:
    """Tool calls are parsed only when the request offered tools and did not forbid them."""
    tools_on = bool(turn.tools) and turn.tool_choice != "none"
    return (config.tool_parser if tools_on else None), config.reasoning_parser


def find_stop(text: str, stops: list[str], start: int = 0) -> int:
    """Index of the earliest stop string in ``text[start:]`` (absolute), or -1."""
    hits = [p for p in (text.find(s, start) for s in stops) if p >= 0]
    return min(hits) if hits else -1


def text_decoder(tokenizer: Any) -> Callable[[list[int]], str]:
    """``ids -> tokenizer.decode(ids, skip_special_tokens=True)``, straight on the Rust tokenizer
    when that is the same function (no clean-up of spaces): transformers' wrapper converts the ids
    one by one first, which cost ~40 µs of a ~150 µs request."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return functools.partial(backend.decode, skip_special_tokens=True)
    return functools.partial(tokenizer.decode, skip_special_tokens=True)


def _tokens_through(decode: Callable[[list[int]], str], ids: list[int], end: int) -> int:
    """Fewest leading ids whose decoded text reaches ``end`` characters (binary search)."""
    lo, hi = 1, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(decode(ids[:mid])) >= end:
            hi = mid
        else:
            lo = mid + 1
    return lo


def engine_kwargs(s: Sampling, session: Session) -> dict:
    """Keyword arguments beyond ``generate``'s basic ones (``areal.engine.interface``): the
    episode as the routing key (a router keeps it on one server), top logprobs when asked for."""
    kwargs: dict = {"session_key": session.episode_id}
    if s.top_logprobs:
        kwargs["top_logprobs_num"] = s.top_logprobs
    return kwargs


def _token_logprobs(gateway: Gateway, ids: list[int], lps: list[float], tops: list) -> list[TokenLogprob]:
    decode = gateway.tokenizer.decode
    out = []
    for i, (tok, lp) in enumerate(zip(ids, lps)):
        if tok in gateway.stop_token_ids:
            continue  # OpenAI lists the content's tokens; the end-of-turn token is no content
        text = decode([tok], skip_special_tokens=False)
        top = [(decode([t], skip_special_tokens=False), float(v)) for v, t in (tops[i] if i < len(tops) else ())]
        out.append(TokenLogprob(token=text, logprob=lp, bytes=list(text.encode()), top=top))
    return out


def parse_version(weight_version: str) -> int:
    """SGLang reports weight_version as a string ('default' before any update)."""
    return int(weight_version) if weight_version.isdigit() else 0


def engine_params(params: dict, seed: int | None, i: int) -> dict:
    """Choice i's sampling params: a seeded request gives it the seed + i."""
    return params if seed is None else {**params, "sampling_seed": seed + i}


def choice_ids(n: int, response_id: str | None) -> list[str]:
    """Interaction ids of n choices; the first is the response id, so ``{id: reward}`` works."""
    return [response_id if i == 0 and response_id else new_id("chatcmpl-") for i in range(n)]


def record_choice(
    gateway: Gateway,
    session: Session,
    turn: Turn,
    prompt: Prompt,
    index: int,
    interaction_id: str,
    result: Any,
    keep: int,
    finish: str,
    parsed: ParsedOutput,
) -> Choice:
    """Record one finished choice as an Interaction and make it findable as a parent. ``keep``:
    how many of the result's tokens the client was answered with."""
    ids, lps = result.output_ids[:keep], result.output_logprobs[:keep]  # slices: the interaction's own lists
    raw = getattr(result, "output_versions", [])[:keep]
    known = {v: parse_version(v) for v in set(raw)}  # one version per generation, usually: parse it once
    versions = [known[v] for v in raw]
    inter = Interaction(
        id=interaction_id,
        prompt_ids=prompt.ids,
        output_ids=ids,
        output_logprobs=lps,
        version=parse_version(result.weight_version),
        finish_reason=finish,
        created=time.time(),
        parent_id=prompt.parent_id,
        output_versions=versions,
        tool_calls=len(parsed.tool_calls),
        malformed_tool_calls=parsed.malformed,
        used_tool_result=used_tool_result(parsed.content, turn.messages),
        max_tokens=turn.sampling.max_tokens if type(turn.sampling.max_tokens) is int else 0,
    )
    session.interactions[inter.id] = inter
    reply = {  # what a follow-up call sends back: a prefill joined to its continuation (assistant_turn)
        "role": "assistant",
        "content": prefill_text(turn) + parsed.content,
        "tool_calls": [{"type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in parsed.tool_calls],
    }
    gateway.prompts.record(session.index, prompt, inter, reply)
    reason = "tool_calls" if parsed.tool_calls and finish == "stop" else finish
    return Choice(
        index=index,
        interaction_id=inter.id,
        parsed=parsed,
        finish_reason=reason,
        prompt_tokens=len(prompt.ids),
        completion_tokens=len(ids),
        logprobs=_token_logprobs(gateway, ids, lps, getattr(result, "output_top_logprobs", [])) if turn.sampling.logprobs else None,
    )


def prompt_choice(
    gateway: Gateway, session: Session, prompt_ids: list[int], parent: str | None, s: Sampling, index: int, interaction_id: str, result: Any
) -> Choice:
    """A raw prompt's finished engine result (``Gateway.complete_prompt``) -> its recorded Choice
    (``parent``: the call the prompt extends): the text cut at the first stop string, unparsed."""
    ids, keep, finish = result.output_ids, len(result.output_ids), result.finish_reason
    text = gateway.decode_text(ids)
    cut = _cut_at_stop(gateway.decode_text, ids, text, s.stop)
    if cut is not None:
        (keep, text), finish = cut, "stop"
    raw = getattr(result, "output_versions", [])[:keep]
    inter = Interaction(
        id=interaction_id,
        prompt_ids=prompt_ids,
        output_ids=ids[:keep],
        output_logprobs=result.output_logprobs[:keep],
        version=parse_version(result.weight_version),
        finish_reason=finish,
        created=time.time(),
        parent_id=parent,
        output_versions=[parse_version(v) for v in raw],
        max_tokens=s.max_tokens,
    )
    session.interactions[inter.id] = inter
    return Choice(
        index=index,
        interaction_id=inter.id,
        parsed=ParsedOutput(content=text),
        finish_reason=finish,
        prompt_tokens=len(prompt_ids),
        completion_tokens=keep,
        logprobs=_token_logprobs(gateway, inter.output_ids, inter.output_logprobs, getattr(result, "output_top_logprobs", []))
        if s.logprobs
        else None,
        token_ids=inter.output_ids,
    )


def used_tool_result(content: str, messages: list[dict]) -> bool:
    """Does a reply use a tool's result: its ``content`` (calls and reasoning parsed out) contains
    the whole content of a ``tool`` message of its history (stripped; blank results do not count).
    A textual rule, the same for every agent: a number the model recomputed itself counts too, and
    a result it reworded does not."""
    if not content:
        return False
    for m in messages:
        if m.get("role") == "tool" and isinstance(m.get("content"), str) and (result := m["content"].strip()) and result in content:
            return True
    return False


def finish_choice(
    gateway: Gateway, session: Session, turn: Turn, prompt: Prompt, index: int, interaction_id: str, result: Any, forced: str = ""
) -> Choice:
    """A finished (non-streamed) engine result -> its recorded Choice. ``forced``: text the gateway
    wrote after the prompt (its ids end ``prompt.ids``); it is parsed as the start of the output."""
    ids, keep, finish = result.output_ids, len(result.output_ids), result.finish_reason
    text = gateway.decode_text(ids)
    cut = _cut_at_stop(gateway.decode_text, ids, text, turn.sampling.stop)
    if cut is not None:
        (keep, text), finish = cut, "stop"
    tool_parser, reasoning_parser = _parsers(turn, gateway.config)
    # the request's tools type some formats' arguments; a prompt may leave a <think> block open
    opened = prompt.reasoning_open and not forced
    parsed = parse_output(forced + text, tool_parser, reasoning_parser, tools=turn.tools, reasoning_open=opened)
    return record_choice(gateway, session, turn, prompt, index, interaction_id, result, keep, finish, parsed)


def _cut_at_stop(decode: Callable[[list[int]], str], ids: list[int], text: str, stops: list[str], start: int = 0) -> tuple[int, str] | None:
    """Where ``text`` (``ids`` decoded) meets its earliest stop string at or after ``start``: the
    ids kept (through the token that completed the stop string) and the text before it; None
    when it meets none."""
    at = find_stop(text, stops, start) if stops else -1
    if at < 0:
        return None
    matched = min((s for s in stops if text.startswith(s, at)), key=len)
    return _tokens_through(decode, ids, at + len(matched)), text[:at]


async def _pump(
    gateway: Gateway,
    session: Session,
    turn: Turn,
    prompt: Prompt,
    params: dict,
    i: int,
    queue: asyncio.Queue[tuple[int, Any]],
    ready: Any = None,
) -> None:
    """Choice ``i``'s engine stream onto ``queue``: each result, then None at its end, or the
    exception that ended it (a close of the session: its 401). A result already sampled
    (``ready``) is the whole stream."""
    if ready is not None:
        queue.put_nowait((i, ready))
        queue.put_nowait((i, None))
        return
    try:
        sp = engine_params(params, turn.sampling.seed, i)
        async for result in gateway.engine.generate_stream(prompt.ids, sp, return_logprob=True, **engine_kwargs(turn.sampling, session)):
            await queue.put((i, result))
    except asyncio.CancelledError:
        if session.closed:  # by close_session: the consumer answers with that
            queue.put_nowait((i, session_closed()))
        raise
    except Exception as e:  # handed to the consumer, which raises it inside the request
        await queue.put((i, e))
        return
    await queue.put((i, None))


def _visible(text: str, final: bool, hold: int) -> int:
    """How much of a choice's ``text`` may be shown: all once final; else not the last ``hold``
    characters (a stop string may still be completing) nor an incomplete UTF-8 sequence."""
    if final:
        return len(text)
    visible = len(text) - hold
    return min(visible, len(text) - 1) if text.endswith("\ufffd") else visible


async def stream_choices(
    gateway: Gateway, session: Session, turn: Turn, prompt: Prompt, params: dict, ids: list[str], forced: str = "", ready: tuple = ()
) -> AsyncIterator[ChoiceDelta]:
    """Merge the n engine streams (or ``ready``: n results already sampled, each one piece) into ChoiceDeltas of the choices ``ids``;
    cancels the engine streams when abandoned. ``forced`` (as in ``finish_choice``) is fed to each choice's parser before its first
    token. The pumps are the session's tasks: its close cancels them, and the stream ends in a 401 error."""
    n, stops = turn.sampling.n, turn.sampling.stop
    size = len(prompt.ids)  # every delta carries it: a stream's first event may report it (Anthropic's message_start)
    queue: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
    tool_parser, reasoning_parser = _parsers(turn, gateway.config)
    opened = prompt.reasoning_open and not forced  # as in finish_choice
    parsers = [StreamParser(tool_parser, reasoning_parser, tools=turn.tools, reasoning_open=opened) for _ in range(n)]
    if forced:  # the opening of a forced tool call: the parser holds it (a span) until the call closes
        for i, p in enumerate(parsers):
            for ev in p.feed(forced):
                yield ChoiceDelta(index=i, kind=ev.kind, text=ev.text, prompt_tokens=size)
    emitted = [0] * n  # characters of decoded text already fed to the parser
    last: list[Any] = [None] * n
    hold = max((len(s) for s in stops), default=1) - 1  # a stop string may still be completing
    tasks = [asyncio.ensure_future(_pump(gateway, session, turn, prompt, params, i, queue, ready[i] if ready else None)) for i in range(n)]
    session.engine_tasks.update(tasks)
    open_ = n
    try:
        while open_:
            i, item = await queue.get()
            if session.closed:  # nothing is recorded into a closed session
                raise session_closed()
            if parsers[i] is None:
                continue  # this choice already ended at a stop string
            if isinstance(item, Exception):
                raise item
            final = item is None or item.finish_reason != ""
            result = last[i] = last[i] if item is None else item
            if result is None:
                raise RequestError(502, "the engine stream ended without a result", kind="engine_error")
            text = gateway.decode_text(result.output_ids)
            keep, finish = len(result.output_ids), result.finish_reason
            cut = _cut_at_stop(gateway.decode_text, result.output_ids, text, stops, max(0, emitted[i] - hold))
            if cut is not None:
                (keep, text), finish, final = cut, "stop", True
                tasks[i].cancel()  # the engine need not sample past the stop string
            visible = _visible(text, final, hold)
            if visible > emitted[i]:
                for ev in parsers[i].feed(text[emitted[i] : visible]):
                    yield ChoiceDelta(index=i, kind=ev.kind, text=ev.text, prompt_tokens=size)
                emitted[i] = visible
            if final:
                session.refund(params["max_new_tokens"], len(result.output_ids))
                events, parsed = parsers[i].finish()
                for ev in events:
                    yield ChoiceDelta(index=i, kind=ev.kind, text=ev.text, prompt_tokens=size)
                choice = record_choice(gateway, session, turn, prompt, i, ids[i], result, keep, finish or "abort", parsed)
                parsers[i] = None
                open_ -= 1
                yield ChoiceDelta(index=i, kind="done", choice=choice, prompt_tokens=size)
    finally:
        for t in tasks:
            t.cancel()
        session.engine_tasks.difference_update(tasks)
