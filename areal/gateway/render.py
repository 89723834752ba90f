"""Prompt token ids for a chat request, built incrementally on the recorded tokens of its parent.

A follow-up call usually sends back the whole history: the messages of an earlier call, the
assistant reply the gateway returned for it, then new messages (tool results, a user turn).
Re-rendering that history would re-tokenise text the model sampled, and a different tokenisation
of the same text is a different sequence to the trainer. So:

    parent:  prompt_ids(M) ── output_ids (sampled, e.g. "...<|im_end|>")
    child:   prompt_ids(M) ── output_ids ── ids(tail of the assistant turn + new messages N)

The parent is found in O(1) by hashing: each recorded interaction is keyed by
``H(tools, raw prompt messages) ⊕ norm(reply)``; a request is looked up at its last few assistant
messages. Only a tiny context (first message, the reply, the new messages) is rendered per turn,
so the cost of a turn does not grow with the history (hashing the raw history is one C-speed
msgspec encode).

Invariants:
- Sampled tokens are never re-rendered: a child's prompt starts with the parent's exact
  ``prompt_ids + output_ids``.
- The tail after the sampled tokens is what the chat template writes after the assistant's
  content (e.g. "\\n" when the model stopped on ``<|im_end|>``, "<|im_end|>\\n" when it was cut by
  ``max_tokens``). When nothing drifted and the model sampled the canonical tokenisation, the
  ids equal a full render of the same messages (tested).
- No match (the agent rewrote history, or a template that is not prefix-stable) means a full
  render and a new root; a request that carries assistant messages yet matches nothing counts as
  drift on its session.

Normalisation for matching a reply: content (None, "" or text parts → text), and tool calls as
(name, arguments with JSON re-encoded with sorted keys); ids and reasoning are ignored, because
SDKs regenerate or drop them. Earlier messages are compared raw (the agent sends them back as it
sent them before).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import msgspec

from areal.gateway.tree import Interaction

_encoder = msgspec.json.Encoder(order="deterministic")
_MAX_CANDIDATES = 4  # assistant messages tried as the parent's reply, newest first


@dataclass
class PromptIndex:
    """Per-session lookup from a (history, reply) hash to the interaction that produced it."""

    by_key: dict[str, str] = field(default_factory=dict)
    drift: int = 0  # follow-up calls whose history matched no recorded reply
    incremental: int = 0  # calls built on a parent's tokens
    full: int = 0  # calls rendered in full
    heads: dict[bytes, str] = field(default_factory=dict)  # render([first message]) by H(tools, first)


@dataclass
class Prompt:
    ids: list[int]
    prefix_digest: bytes  # H(tools, messages) of this call, for the key of its replies
    parent_id: str | None = None
    drift: bool = False


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return str(content)


def _canonical_args(arguments: Any) -> Any:
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except ValueError:
            return arguments
    return arguments


def normalise_reply(message: dict) -> bytes:
    """The comparable form of an assistant message (see the module docstring)."""
    calls = []
    for call in message.get("tool_calls") or ():
        fn = call.get("function") or {} if isinstance(call, dict) else {}
        calls.append([fn.get("name", ""), _canonical_args(fn.get("arguments", ""))])
    return _encoder.encode([_text(message.get("content")), calls])


def prefix_digest(tools: list[dict] | None, messages: list[dict]) -> bytes:
    h = hashlib.blake2b(digest_size=16)
    h.update(_encoder.encode(tools))
    h.update(b"\x00")
    h.update(_encoder.encode(messages))
    return h.digest()


def reply_key(prefix: bytes, reply: dict) -> str:
    return hashlib.blake2b(prefix + normalise_reply(reply), digest_size=16).hexdigest()


class PromptBuilder:
    """Chat template + tokenizer, with incremental rendering on a session's recorded tokens."""

    def __init__(self, tokenizer: Any, stop_token_ids: list[int]) -> None:
        self.tokenizer = tokenizer
        self.stop_token_ids = set(stop_token_ids)
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if not isinstance(eos, int) or eos < 0 or eos == tokenizer.unk_token_id:
            eos = tokenizer.eos_token_id
        self.end_of_turn = tokenizer.convert_ids_to_tokens(eos)  # text the template closes a turn with
        # The Rust tokenizer directly: transformers' encode/decode wrappers cost ~10x more per call.
        self._backend = getattr(tokenizer, "backend_tokenizer", None)

    def render_text(self, messages: list[dict], tools: list[dict] | None, generation: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False,
                                                  add_generation_prompt=generation)

    def encode(self, text: str) -> list[int]:
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def full(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        return self.encode(self.render_text(messages, tools, True))

    def build(self, index: PromptIndex, interactions: dict[str, Interaction], messages: list[dict],
              tools: list[dict] | None) -> Prompt:
        """Prompt ids for ``messages``: on the parent's tokens when one matches, else a full render."""
        digest = prefix_digest(tools, messages)
        assistant_at = [i for i in range(len(messages) - 1, 0, -1) if messages[i].get("role") == "assistant"]
        for k in assistant_at[:_MAX_CANDIDATES]:
            parent_id = index.by_key.get(reply_key(prefix_digest(tools, messages[:k]), messages[k]))
            parent = interactions.get(parent_id) if parent_id is not None else None
            if parent is None:
                continue
            ids = self._extend(index, parent, messages[0], messages[k], messages[k + 1:], tools)
            if ids is not None:
                index.incremental += 1
                return Prompt(ids=ids, prefix_digest=digest, parent_id=parent.id)
        index.full += 1
        drift = bool(assistant_at)
        index.drift += drift
        return Prompt(ids=self.full(messages, tools), prefix_digest=digest, drift=drift)

    def record(self, index: PromptIndex, prompt: Prompt, interaction: Interaction, reply: dict) -> None:
        """Make ``interaction`` findable as the parent of calls that extend ``reply``."""
        key = reply_key(prompt.prefix_digest, reply)
        interaction.messages_hash = key
        index.by_key[key] = interaction.id

    def _extend(self, index: PromptIndex, parent: Interaction, first: dict, reply: dict, new: list[dict],
                tools: list[dict] | None) -> list[int] | None:
        """parent prompt + sampled ids + ids(template tail of the reply turn + new messages);
        None when the template does not render the small context prefix-stably."""
        ctx = [first, reply]
        head_key = prefix_digest(tools, ctx[:1])
        head = index.heads.get(head_key)
        if head is None:  # one entry per (tools, first message): usually one per session
            head = index.heads[head_key] = self.render_text(ctx[:1], tools, True)
        base = self.render_text(ctx, tools, False)
        full = self.render_text(ctx + new, tools, True) if new else self.render_text(ctx, tools, True)
        if not base.startswith(head) or not full.startswith(base):
            return None
        turn = base[len(head):]  # the reply's turn as the template writes it
        sampled = self.decode(parent.output_ids)
        eot = self.end_of_turn
        if turn.startswith(sampled):
            tail = turn[len(sampled):]
        elif eot in turn:
            # The template rewrites the content (e.g. drops reasoning) but the sampled tokens stand;
            # keep only what it writes after the turn's end (or the end itself, if none was sampled).
            ended = bool(parent.output_ids) and parent.output_ids[-1] in self.stop_token_ids
            cut = turn.rindex(eot)
            tail = turn[cut + len(eot):] if ended else turn[cut:]
        else:
            return None
        return parent.prompt_ids + parent.output_ids + self.encode(tail + full[len(base):])
