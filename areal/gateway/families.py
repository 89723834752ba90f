"""Model families: what the gateway reads off a tokenizer besides its chat template.

- ``detect_tool_parser``: ``tool_parser=auto`` -> the format the chat template of requests with
  tools writes tool calls in (harmony channels, Qwen3-Coder's ``<function=...>``, DeepSeek's
  ``<｜tool▁calls▁begin｜>`` with or without the fenced JSON of V3, Mistral's ``[TOOL_CALLS]``,
  ``<tool_call>`` JSON, Llama 3's ``<|python_tag|>`` / ``"parameters"`` JSON), or a ``ValueError``
  saying it cannot tell. That template is ``gateway.tool_template`` when one is set (``chatml-tools``
  gives ``qwen25``), else the tokenizer's. A template with no tool branch at all (SmolLM2-Instruct's,
  Gemma 2's) is one it cannot tell: the error names ``gateway.tool_template`` as well as
  ``gateway.tool_parser``, since such a model is shown no tools until a tool template is set.
- ``resolve``: the gateway's config with ``auto`` replaced and GPT-OSS's pair made whole (harmony
  is the whole output format: its reasoning parser is ``gpt-oss`` whenever its tool parser is).
- ``gateway_config``: the gateway's config with its context capped at the model directory's
  ``max_position_embeddings`` (a run's gateway and ``python -m areal.gateway`` alike).
- ``stop_token_ids``: the end of sequence and every turn end the tokenizer has as an added token:
  ``<|im_end|>`` (ChatML), ``<|eot_id|>`` / ``<|eom_id|>`` (Llama 3; the latter after a
  ``<|python_tag|>`` call), ``<|call|>`` / ``<|return|>`` (GPT-OSS; not ``<|end|>``, which
  separates messages inside one output), ``<｜end▁of▁sentence｜>`` (DeepSeek).
- ``text_decoder``: sampled ids -> the text the parsers read. Special tokens are dropped, except
  the markers of the configured parsers: in Llama 3's and GPT-OSS's vocabularies ``<|python_tag|>``
  and harmony's ``<|channel|>``... are special tokens, and a parser cannot find what decoding
  removed. Stop tokens stay dropped. Without such markers it is ``generation.text_decoder``.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal.gateway import harmony
from areal.gateway.generation import text_decoder as plain_text_decoder
from areal.gateway.parsers import (
    AUTO,
    DS_CALLS_OPEN,
    DS_MARKERS,
    LLAMA_OPEN,
    MISTRAL_MARKERS,
    MISTRAL_OPEN,
    QWEN_CLOSE,
    QWEN_OPEN,
    THINK_CLOSE,
    THINK_OPEN,
    TOOL_PARSERS,
)

if TYPE_CHECKING:
    from areal.gateway.core import GatewayConfig

TURN_ENDS = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", harmony.CALL, harmony.RETURN, "<\uff5cend\u2581of\u2581sentence\uff5c>")
_TOOL_PROBE = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object", "properties": {}}}}]


def _markers(tool_parser: str | None, reasoning_parser: str | None) -> tuple[str, ...]:
    """The marker texts the parsers of this pair look for in decoded text."""
    match tool_parser:
        case "qwen25" | "hermes" | "qwen3_coder":
            tool: tuple[str, ...] = (QWEN_OPEN, QWEN_CLOSE)
        case "llama3":
            tool = (LLAMA_OPEN,)
        case "mistral":
            tool = MISTRAL_MARKERS
        case "deepseekv3" | "deepseekv31":
            tool = DS_MARKERS
        case _:  # None, or gpt-oss (its markers below)
            tool = ()
    if "gpt-oss" in (tool_parser, reasoning_parser):
        tool += tuple(m for m in harmony.MARKERS if m not in (harmony.CALL, harmony.RETURN))
    return tool + ((THINK_OPEN, THINK_CLOSE) if reasoning_parser == "think" else ())


def _template(tokenizer: Any) -> str:
    """The chat template the tokenizer renders a request with tools by ("" when it has none)."""
    try:
        return tokenizer.get_chat_template(None, _TOOL_PROBE)
    except (ValueError, AttributeError):  # no template at all
        return ""


def detect_tool_parser(tokenizer: Any, tool_template: str | None = None) -> str:
    """The tool-call format the template of requests with tools writes (for ``tool_parser=auto``):
    ``tool_template`` (the text of ``gateway.tool_template``) when given, else the tokenizer's."""
    source = tool_template if tool_template is not None else _template(tokenizer)
    vocab = tokenizer.get_vocab()
    if harmony.CHANNEL in source and harmony.MESSAGE in source:
        return "gpt-oss"
    if "<function=" in source and "<parameter=" in source:
        return "qwen3_coder"
    if DS_CALLS_OPEN in source:
        return "deepseekv3" if "```json" in source else "deepseekv31"
    if MISTRAL_OPEN in source or MISTRAL_OPEN in vocab:
        return "mistral"
    if QWEN_OPEN in source:
        return "qwen25"
    if LLAMA_OPEN in source or ('"parameters"' in source and ("<|start_header_id|>" in source or LLAMA_OPEN in vocab)):
        return "llama3"
    what = "has no chat template" if not source else "writes tool calls in none of the formats this gateway parses"
    who = (
        "gateway.tool_template"
        if tool_template is not None
        else f"the tokenizer ({getattr(tokenizer, 'name_or_path', '') or type(tokenizer).__name__})"
    )
    message = (
        f"gateway.tool_parser=auto: {who} {what}; "
        f"set gateway.tool_parser to one of {', '.join(TOOL_PARSERS)} (or SGLang's / vLLM's name), or None for no tool calls"
    )
    if source and "tool" not in source.lower():  # no tool branch: the model is shown no tools at all
        message += (
            ". Its chat template has no tool branch, so the model is shown no tools: set gateway.tool_template to a template "
            "that renders them (chatml-tools for a ChatML model, or the path of a .jinja file), and auto reads its format"
        )
    raise ValueError(message)


def resolve(config: Any, tokenizer: Any, tool_template: str | None = None) -> Any:
    """``config`` (a ``GatewayConfig``) with ``tool_parser=auto`` read off the template of requests
    with tools (``tool_template``, the text of ``gateway.tool_template``, else the tokenizer's) and
    GPT-OSS's reasoning parser paired with its tool parser; the same object when nothing changes."""
    tool, reasoning = config.tool_parser, config.reasoning_parser
    if tool == AUTO:
        tool = detect_tool_parser(tokenizer, tool_template)
    if tool == "gpt-oss":
        reasoning = "gpt-oss"
    elif reasoning == "gpt-oss" and tool is not None:
        raise ValueError(f"gateway.reasoning_parser='gpt-oss' (harmony) goes with gateway.tool_parser 'gpt-oss' or None, not {tool!r}")
    if (tool, reasoning) == (config.tool_parser, config.reasoning_parser):
        return config
    return dataclasses.replace(config, tool_parser=tool, reasoning_parser=reasoning)


def gateway_config(gw: GatewayConfig, model: Path, write: Callable[[str], None]) -> GatewayConfig:
    """``gw``, its context length capped at what the ``model`` directory's model holds
    (``max_position_embeddings``), so that the gateway refuses a prompt the engine could not
    take, with a 400 naming it."""
    limit = json.loads((model / "config.json").read_text()).get("max_position_embeddings")
    if isinstance(limit, int) and 0 < limit < gw.context_length:
        write(f"[gateway] context_length {gw.context_length} capped at the model's {limit} positions")
        return dataclasses.replace(
            gw, context_length=limit, max_tokens_cap=min(gw.max_tokens_cap, limit), default_max_tokens=min(gw.default_max_tokens, limit)
        )
    return gw


def _added_ids(tokenizer: Any, texts: tuple[str, ...]) -> list[int]:
    """Ids of those ``texts`` that are single tokens of the tokenizer."""
    vocab = tokenizer.get_vocab()
    return [vocab[t] for t in texts if t in vocab]


def stop_token_ids(tokenizer: Any) -> list[int]:
    """The ids that end a sampled turn: the tokenizer's eos and the family turn ends it has."""
    ids = set(_added_ids(tokenizer, TURN_ENDS))
    if isinstance(tokenizer.eos_token_id, int) and tokenizer.eos_token_id >= 0:
        ids.add(tokenizer.eos_token_id)
    return sorted(ids)


def text_decoder(tokenizer: Any, tool_parser: str | None, reasoning_parser: str | None) -> Callable[[list[int]], str]:
    """ids -> text with special tokens dropped but the parsers' markers kept (see the module doc)."""
    keep = set(_added_ids(tokenizer, _markers(tool_parser, reasoning_parser)))
    special = set(getattr(tokenizer, "all_special_ids", ()))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:
        special |= {i for i, t in backend.get_added_tokens_decoder().items() if t.special}
    if not keep & special:  # every marker survives skip_special_tokens already
        return plain_text_decoder(tokenizer)
    drop = frozenset(special - keep)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return functools.partial(_decode_kept, backend.decode, drop)
    return functools.partial(_decode_kept, tokenizer.decode, drop)


def _decode_kept(decode: Callable[..., str], drop: frozenset[int], ids: list[int]) -> str:
    return decode([i for i in ids if i not in drop], skip_special_tokens=False)
