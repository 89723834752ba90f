"""What a request asks of the assistant turn it opens: text to continue (a prefill), and reasoning on or off.

Prefill (Anthropic's final assistant message; chat's ``continue_final_message``, vLLM's and
SGLang's extension): the reply continues the last message's text instead of starting a new turn.

    history ── generation prompt ──┬── continuation text (template's opening of the turn, prefill) ── sampled
    plan(history): incremental     │   ids(continuation): recorded as prompt (loss mask 0, no logprob)
                                   └── the split: a full render of the partial turn starts with the
                                       generation prompt's render (else a 400: no prefill possible)

- The prompt is the history's prompt, built as any other (on a parent's tokens when one matches,
  drift counted on the history alone), then the ids of the text the template writes for the
  final assistant message after its generation prompt, cut where the prefill ends, as
  transformers' ``continue_final_message`` cuts it (Qwen3 with thinking on writes an empty
  ``<think>`` block before it, as it does for any final assistant turn). No end of turn follows.
- The reply is only the continuation (Anthropic's definition; vLLM's too), parsed alone: a prefill
  that leaves a ``<think>`` block open makes the continuation reasoning until it closes. The
  recorded reply (what a follow-up call is matched on) is prefill + continuation: the message a
  client sends back when it joins them, so that call extends this one's tokens.
- The last message must be an assistant message with text, no tool calls, not only whitespace,
  after at least one other message; a prefill cannot go with a forced tool call or a response
  format (both constrain the turn from its start).

Reasoning (chat's ``reasoning_effort``, Responses' ``reasoning.effort``, Anthropic's ``thinking``,
all in OpenAI's effort vocabulary by then): where the chat template has a switch
(``template.thinking_switch``), "none" / "minimal" turn it off and other efforts on (a template
that takes the effort itself, GPT-OSS's, gets "low" / "medium" / "high" as they are); it is a
keyword argument of the template, added to the request's ``chat_template_kwargs`` (one that
already sets the switch otherwise is a 400). Where the template has none (SmolLM2, the embedded
model), "none" is accepted, as it asks for what the model does anyway, and every other effort is
a 400 with OpenAI's code ``unsupported_parameter``, naming the field, as OpenAI answers for a
model that does not reason.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from areal.gateway.contract import RequestError, Turn
from areal.gateway.template import THINK_OPEN

if TYPE_CHECKING:
    from areal.gateway.render import PromptBuilder

_THINK_CLOSE = "</think>"
_OFF = ("none", "minimal")  # efforts that switch reasoning off where the model has a switch
_EFFORTS_TAKEN = ("low", "medium", "high")  # what a template that reads reasoning_effort itself takes (GPT-OSS)


def apply_reasoning(turn: Turn, switch: str | None) -> None:
    """Map ``turn.reasoning_effort`` onto the template's ``switch`` (its ``chat_template_kwargs``), in
    place; a 400 naming ``turn.reasoning_param`` where it cannot be honoured (module docstring)."""
    effort, param = turn.reasoning_effort, turn.reasoning_param
    if effort is None:
        return
    if switch is None:
        if effort == "none":
            return  # no reasoning asked of a model without any: honoured as it is
        raise RequestError(
            400,
            f"{param} is not supported with this model: its chat template has no thinking switch "
            "(a request for no reasoning is accepted: reasoning_effort 'none', thinking {'type': 'disabled'})",
            param=param,
            code="unsupported_parameter",
        )
    if switch == "reasoning_effort":
        if effort not in _EFFORTS_TAKEN:
            raise RequestError(
                400,
                f"{param}: this model's chat template takes a reasoning effort of {', '.join(_EFFORTS_TAKEN)}; "
                f"{effort!r} cannot be honoured",
                param=param,
                code="unsupported_value",
            )
        value: str | bool = effort
    else:
        value = effort not in _OFF
    kwargs = turn.chat_template_kwargs or {}
    if switch in kwargs and kwargs[switch] != value:
        raise RequestError(
            400, f"{param} asks for {switch}={value!r} but chat_template_kwargs sets {switch}={kwargs[switch]!r}", param=param
        )
    turn.chat_template_kwargs = {**kwargs, switch: value}


def prefill_text(turn: Turn) -> str:
    """The text the reply continues: the last message's content under ``continue_final``, else ""."""
    return (turn.messages[-1].get("content") or "") if turn.continue_final else ""


def history(turn: Turn) -> list[dict]:
    """The messages the prompt renders as a conversation: all but a prefill."""
    return turn.messages[:-1] if turn.continue_final else turn.messages


def check_prefill(turn: Turn) -> None:
    """A 400 naming the field for a prefill that cannot be continued (module docstring); a validated turn."""
    if not turn.continue_final:
        return
    at = f"messages[{len(turn.messages) - 1}]"
    last = turn.messages[-1]
    if last.get("role") != "assistant" or last.get("tool_calls"):
        raise RequestError(400, f"{at}: the message to continue must be an assistant message without tool calls", param=at)
    if not (last.get("content") or "").strip():
        raise RequestError(400, f"{at}: the assistant message to continue has no text", param=f"{at}.content")
    if len(turn.messages) < 2:
        raise RequestError(400, "a prefill needs a message before it", param="messages")
    if turn.tool_choice not in (None, "auto", "none"):
        raise RequestError(400, "a prefill cannot go with a forced tool call: both write the start of the turn", param="tool_choice")
    if turn.response_schema is not None:
        param = turn.response_schema_param
        raise RequestError(400, f"a prefill cannot go with {param}: the schema constrains the reply from its start", param=param)


def continuation(prompts: PromptBuilder, turn: Turn, tools: list[dict] | None) -> str:
    """The text after the history's generation prompt that opens the final assistant turn and
    writes its prefill: a full render of the conversation ending in that turn, cut where the
    prefill ends (transformers' rule: its stripped text, with the leading space kept when the
    template keeps it), after the render of the history with a generation prompt."""
    kwargs = turn.chat_template_kwargs
    head = prompts.render_text(history(turn), tools, True, kwargs)
    whole = prompts.render_text(turn.messages, tools, False, kwargs)
    prefill = prefill_text(turn)
    at = whole.rfind(prefill.strip())
    if not whole.startswith(head) or at < len(head):
        raise RequestError(
            400,
            "the model's chat template writes a final assistant turn that does not follow its generation prompt; "
            "it cannot continue a prefill",
            param=f"messages[{len(turn.messages) - 1}]",
        )
    end = at + len(prefill.lstrip()) if whole.startswith(prefill.lstrip(), at) else at + len(prefill.strip())
    return whole[len(head) : end]


def leaves_reasoning_open(opened: bool, text: str) -> bool:
    """Whether a prompt ends inside a ``<think>`` block after ``text`` is appended to one that
    ``opened`` one (``Prompt.reasoning_open``)."""
    last_open, last_close = text.rfind(THINK_OPEN), text.rfind(_THINK_CLOSE)
    return last_open > last_close if last_open >= 0 or last_close >= 0 else opened
