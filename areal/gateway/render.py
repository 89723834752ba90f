"""Prompt token ids for a chat request, built incrementally on the recorded tokens of its parent.

A follow-up call usually sends back the whole history: the messages of an earlier call, the
assistant reply the gateway returned for it, then new messages (tool results, a user turn).
Re-rendering that history would re-tokenise text the model sampled, and a different tokenisation
of the same text is a different sequence to the trainer. So:

    parent:  prompt_ids(M) ── output_ids (sampled, e.g. "...<|im_end|>")
    child:   prompt_ids(M) ── output_ids ── ids(tail of the assistant turn + new messages N)

The parent is found in O(1) by hashing: each recorded interaction is keyed by
``H(tools, raw prompt messages) ⊕ norm(reply)``; a request is looked up at its last few assistant
messages. Only a tiny context (the lead: the history's first messages through its first user
message; the reply; the new messages) is rendered per turn, once: when the render writes the
sampled text back verbatim after the cached render of the lead, everything after it is the reply
turn's tail and the new messages; only a template that rewrites the reply (drops reasoning, writes
the call in another spelling) costs a second render to find the turn's end, the last of the turn
ends the tokenizer has (``<|im_end|>``, ``<|eot_id|>``, GPT-OSS's ``<|call|>``...). The lead is
more than the first message because templates read more than the message they write (Llama 3.1
puts the tools in the first user message, Qwen3 keeps reasoning only after the last user query,
Qwen3.5 refuses a history without one); and it starts at the history's first message, so a template
that writes a default system prompt when the conversation has no system message (SmolLM2's) writes
it in the small context as in the full render. So the
Python work of a turn does not grow with the history. What still touches the whole history runs at
C speed, once per turn: one msgspec encode of the messages, one memcmp against the previous call's
encoding, and one copy of the parent's ids into the new prompt list (``Interaction.prompt_ids`` is
a plain list that the engine call and every reader share; the copy, and the garbage collector's
walks over those lists, are the part of an episode that is quadratic). The hash itself is
incremental: the encoding of ``messages[:k]`` is a prefix of the encoding of ``messages``, and the
previous call's encoding (less its closing ``]``) is a prefix of this one's, so the session keeps
the hash state at that point (``HistoryHash``) and hashes only the new bytes; any other history
hashes from the start.

Rendering is ``template.ChatTemplate``'s: the compiled template called directly (for a request with
tools, ``gateway.tool_template`` when one is set), messages handed
to it as SGLang and vLLM hand them (tool-call arguments as objects where the template takes them),
the request's ``chat_template_kwargs`` (Qwen3's ``enable_thinking``) passed on; those kwargs key
the hashes along with the tools, so a call rendered with other kwargs is neither a parent nor a
cached render. A template that can leave ``<think>`` open at the end of a prompt (Qwen3.5,
DeepSeek-V3.1 with thinking) has each prompt's last ids checked (``Prompt.reasoning_open``), so
the parsers know the output starts as reasoning. Full renders (first turns,
which repeat across the samples of one prompt) are cached by their digest in an LRU shared by
the sessions that used them: bounded in bytes (``render_cache_bytes``, ids counted at 36 bytes:
a list slot + an int object), and an entry goes when the last session holding it is released
(closed or expired), so no cache outlives its sessions. A render is cached only once its prompt
was accepted (it fits the context).

A build is two steps so that the caller can tokenise a long text off its event loop: ``plan``
(hash, match, render: everything but the tokenizer) and ``finish`` (given the text's ids);
``build`` does both at once. ``min_tokens(text)`` is a floor on the ids of a text from its
length alone, for refusing a prompt that cannot fit before tokenising it: in a byte-level BPE
every vocabulary entry is one character per byte, so no token stands for more characters than
the longest entry has (x4 under NFC, which composes at most 4 code points into one).

Tokenising goes through ``PieceEncoder`` (pieces.py) where it reproduces the tokenizer's pipeline exactly
(checked by a probe at construction, else the Rust tokenizer): short pieces between added tokens
that recur (the generation prompt, the "\\n" after a turn's end) are encoded once, and ASCII text
is split into words by the same pattern and encoded from a word cache. Warm, that is ~2.5x
cheaper than the tokenizer's own call (whose Oniguruma pre-tokenizer regex was a quarter of a
turn); on text made only of never-seen words it is ~1.2x dearer.

Where a turn's CPU goes (200-turn episode, embedded tokenizer, ``benchmarks/gateway.py``: ~55-70
us a turn, ~28 us at 25 turns): about half stays flat: the one small render (~12 us), the reply
keys and the hash checkpoint, decoding the parent's sampled ids (~4), preparing the messages and
tokenising the new text (~3 each). The other half grows with the history, at C speed: the history
encode + hash (~19 us at 200 turns), the copy of the parent's ids (~12) and the garbage
collector's walks over the recorded id lists (~9; every ``Interaction`` holds its whole prompt,
so an episode's ids are quadratic in its turns). Removing that half needs a different record,
not a different builder: a prompt stored as its parent + a suffix, and the request's raw
``messages`` bytes hashed instead of re-encoded.

Invariants:
- Sampled tokens are never re-rendered: a child's prompt starts with the parent's exact
  ``prompt_ids + output_ids``.
- The tail after the sampled tokens is what the chat template writes after the assistant's
  content (e.g. "\\n" when the model stopped on ``<|im_end|>``, "<|im_end|>\\n" when it was cut by
  ``max_tokens``). When nothing drifted and the model sampled the canonical tokenisation, the
  ids equal a full render of the same messages (tested).
- No match (the agent rewrote history, or a template that is not prefix-stable: Qwen3 dropping
  earlier reasoning after a new user query, GPT-OSS dropping analysis after a final answer) means
  a full render and a new root; a request that carries assistant messages yet matches nothing
  counts as drift on its session.

Normalisation for matching a reply: content (None, "" or text parts → text), and tool calls as
(name, arguments with JSON re-encoded with sorted keys); ids and reasoning are ignored, because
SDKs regenerate or drop them. Earlier messages are compared raw (the agent sends them back as it
sent them before).
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from areal.gateway.pieces import PieceEncoder
from areal.gateway.template import TEMPLATE_ERRORS, THINK_OPEN, ChatTemplate, check_template_kwargs
from areal.gateway.tree import Interaction

_encoder = msgspec.json.Encoder(order="deterministic")
_MAX_CANDIDATES = 4  # assistant messages tried as the parent's reply, newest first
_FULL_CACHE = 1024  # full renders kept (ids by digest), across sessions
_ID_BYTES = 36  # what one cached id costs: its list slot (8) + its int object (28; ids > 256 are not shared)
_NFC_SLACK = 4  # NFC composes at most 4 code points into one (the longest canonical decomposition)
_THINK_TAIL = 8  # prompt ids decoded to see whether the prompt ends by opening a <think> block


@dataclass
class HistoryHash:
    """Where the previous call's history hash stopped, so the next call hashes only its new bytes.

    ``state`` is blake2b after ``tools``, ``b"\\x00"`` and ``encoded[:size]``; a later history whose
    encoding starts with exactly those bytes (and the same tools) continues from a copy of it.
    """

    tools: bytes  # encode(tools)
    encoded: bytes  # encode(messages) of the previous call
    size: int  # bytes of ``encoded`` in ``state``: all but the closing "]"
    state: Any  # hashlib.blake2b


@dataclass
class PromptIndex:
    """Per-session lookup from a (history, reply) hash to the interaction that produced it."""

    by_key: dict[str, str] = field(default_factory=dict)
    drift: int = 0  # follow-up calls whose history matched no recorded reply
    incremental: int = 0  # calls built on a parent's tokens
    full: int = 0  # calls rendered in full
    heads: dict[bytes, str] = field(default_factory=dict)  # render(lead messages) by H(tools, lead)
    history: HistoryHash | None = None  # the last call's hash state (a cache: checked byte for byte)
    cached: set[bytes] = field(default_factory=set)  # digests of the shared full renders this session holds


@dataclass
class Prompt:
    ids: list[int]
    prefix_digest: bytes  # H(tools, messages) of this call, for the key of its replies
    parent_id: str | None = None
    drift: bool = False
    reasoning_open: bool = False  # the prompt ends by opening a <think> block: the output starts as reasoning


@dataclass
class PromptPlan:
    """A prompt before its last text is tokenised: ``head + sampled + ids(text)``."""

    head: list[int]  # the parent's prompt ids; a cached full render's ids; or [] (a render to tokenise)
    sampled: list[int]  # the parent's sampled ids, or []
    text: str  # still to tokenise ("" for a cache hit)
    prefix_digest: bytes
    parent_id: str | None = None
    drift: bool = False
    cache_key: bytes | None = None  # a full render that missed the cache: kept under this digest once tokenised

    @property
    def known(self) -> int:
        """Ids already known (the text's are not)."""
        return len(self.head) + len(self.sampled)


@dataclass
class _Render:
    ids: list[int]
    holders: set[int]  # id() of each session's PromptIndex holding it (``release`` drops them)


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


def _newest_assistants(messages: list[dict]) -> list[int]:
    """Indices (> 0) of the newest ``_MAX_CANDIDATES`` assistant messages, newest first; the scan
    stops there, so a turn does not walk the whole history."""
    found = []
    for i in range(len(messages) - 1, 0, -1):
        m = messages[i]
        if m.get("role") == "assistant":
            found.append(i)
            if len(found) == _MAX_CANDIDATES:
                break
    return found


def _digests(tools: list[dict] | None, messages: list[dict], k: int | None) -> tuple[bytes, bytes | None]:
    """(prefix_digest(tools, messages), prefix_digest(tools, messages[:k]) or None), hashing once."""
    whole, head, _ = _hash_history(tools, messages, k, None)
    return whole, head


def _hash_history(
    tools: list[dict] | None, messages: list[dict], k: int | None, last: HistoryHash | None
) -> tuple[bytes, bytes | None, HistoryHash]:
    """``_digests`` continuing from ``last`` where this history extends it, and the new checkpoint.

    ``encode(messages)`` is ``[`` + e0,...,e(k-1) + ``,`` + ek,... + ``]`` and ``encode(messages[:k])``
    is the same up to e(k-1) and then ``]``: the tail's own encoding gives the cut. The previous
    call's bytes are reused only when this encoding starts with them (a memcmp), so a rewritten
    history or other tools simply hash from the start.
    """
    tools_enc = _encoder.encode(tools)
    whole = _encoder.encode(messages)
    cut = len(whole) - len(_encoder.encode(messages[k:])) if k else None  # the tail's "[" stands where the comma was
    end = len(whole) - 1
    view = memoryview(whole)
    if (
        last is not None
        and last.size <= (end if cut is None else cut)
        and last.tools == tools_enc
        and whole.startswith(memoryview(last.encoded)[: last.size])
    ):
        h, at = last.state.copy(), last.size
    else:
        h, at = hashlib.blake2b(digest_size=16), 0
        h.update(tools_enc)
        h.update(b"\x00")
    head = None
    if cut is not None:
        h.update(view[at:cut])
        at = cut
        head_hash = h.copy()
        head_hash.update(b"]")
        head = head_hash.digest()
    h.update(view[at:end])
    checkpoint = HistoryHash(tools=tools_enc, encoded=whole, size=end, state=h.copy())
    h.update(view[end:])
    return h.digest(), head, checkpoint


def reply_key(prefix: bytes, reply: dict) -> str:
    return hashlib.blake2b(prefix + normalise_reply(reply), digest_size=16).hexdigest()


class PromptBuilder:
    """Chat template + tokenizer, with incremental rendering on a session's recorded tokens."""

    def __init__(self, tokenizer: Any, stop_token_ids: list[int], cache_bytes: int = 64 << 20, tool_template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.stop_token_ids = set(stop_token_ids)
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if not isinstance(eos, int) or eos < 0 or eos == tokenizer.unk_token_id:
            eos = tokenizer.eos_token_id
        self.end_of_turn = tokenizer.convert_ids_to_tokens(eos)  # text the template closes a turn with
        # every text a turn may end with (GPT-OSS: <|call|> and <|return|>; Llama 3: <|eot_id|>, <|eom_id|>)
        self.turn_ends = tuple(dict.fromkeys([self.end_of_turn, *tokenizer.convert_ids_to_tokens(sorted(self.stop_token_ids))]))
        # The Rust tokenizer directly: transformers' encode/decode wrappers cost ~10x more per call;
        # its batch call without offsets is a third cheaper again than ``encode`` (same ids).
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._encode_fast = getattr(self._backend, "encode_batch_fast", None)
        self._pieces = PieceEncoder.build(self._backend) if self._backend is not None else None
        self.cache: OrderedDict[bytes, _Render] = OrderedDict()  # full renders by digest, oldest first
        self.cache_bytes = 0  # ids in ``cache`` * _ID_BYTES
        self.cache_limit = cache_bytes
        self.chars_per_token = _chars_per_token(self._backend)  # None: no floor known for this tokenizer
        self.template = ChatTemplate(tokenizer, tool_template)  # tool_template: the text of gateway.tool_template

    def render_text(self, messages: list[dict], tools: list[dict] | None, generation: bool, template_kwargs: dict | None = None) -> str:
        """The chat template's text for ``messages`` (a 400 when the template refuses them)."""
        return self.template.render_text(messages, tools, generation, template_kwargs)

    def full_text(self, messages: list[dict], tools: list[dict] | None, template_kwargs: dict | None = None) -> str:
        """The text of a full render of ``messages``, checked as ``plan`` checks a request (its
        kwargs; tools or calls the template would drop); no session's index is read or changed."""
        check_template_kwargs(template_kwargs)
        self.template.check_tools(tools, messages)
        return self.render_text(messages, tools, True, template_kwargs)

    def encode(self, text: str) -> list[int]:
        if self._pieces is not None:
            return self._pieces.encode(text)
        if self._encode_fast is not None:
            return self._encode_fast([text], add_special_tokens=False)[0].ids
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def encode_large(self, text: str) -> list[int]:
        """``encode`` for a long text, safe to call from a worker thread: the Rust tokenizer (which
        releases the GIL; ``PieceEncoder`` gives the same ids, by its invariant, but runs Python
        and fills its caches with words it will not see again)."""
        if self._encode_fast is not None:
            return self._encode_fast([text], add_special_tokens=False)[0].ids
        if self._backend is not None:
            return self._backend.encode(text, add_special_tokens=False).ids
        return self.tokenizer.encode(text, add_special_tokens=False)

    def min_tokens(self, text: str) -> int:
        """A floor on ``len(encode(text))`` from the text's length alone (0 where none is known)."""
        return -(-len(text) // self.chars_per_token) if self.chars_per_token else 0

    def decode(self, ids: list[int]) -> str:
        if self._backend is not None:
            return self._backend.decode(ids, skip_special_tokens=False)
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def full(self, messages: list[dict], tools: list[dict] | None, template_kwargs: dict | None = None) -> list[int]:
        return self.encode(self.render_text(messages, tools, True, template_kwargs))

    def build(
        self,
        index: PromptIndex,
        interactions: dict[str, Interaction],
        messages: list[dict],
        tools: list[dict] | None,
        template_kwargs: dict | None = None,
    ) -> Prompt:
        """Prompt ids for ``messages``: on the parent's tokens when one matches, else a full render."""
        plan = self.plan(index, interactions, messages, tools, template_kwargs)
        return self.finish(plan, self.encode(plan.text) if plan.text else [], index)

    def plan(
        self,
        index: PromptIndex,
        interactions: dict[str, Interaction],
        messages: list[dict],
        tools: list[dict] | None,
        template_kwargs: dict | None = None,
    ) -> PromptPlan:
        """Everything of ``build`` but tokenising the text that ends the prompt. ``template_kwargs``
        (the request's ``chat_template_kwargs``) render with the template and key the hashes with
        the tools: a call rendered with other kwargs is not a parent, nor a cached render."""
        check_template_kwargs(template_kwargs)
        self.template.check_tools(tools, messages)  # tools the template would leave out: a 400, not a silent prompt
        keyed = [tools, template_kwargs] if template_kwargs else tools  # a tools list holds only dicts: no clash
        assistant_at = _newest_assistants(messages)
        digest, newest, checkpoint = _hash_history(keyed, messages, assistant_at[0] if assistant_at else None, index.history)
        index.history = checkpoint
        for j, k in enumerate(assistant_at):
            head = newest if j == 0 else prefix_digest(keyed, messages[:k])
            assert head is not None
            parent_id = index.by_key.get(reply_key(head, messages[k]))
            parent = interactions.get(parent_id) if parent_id is not None else None
            if parent is None:
                continue
            lead = messages[: _lead_end(messages, k)]
            delta = self._extend(index, parent, lead, messages[k], messages[k + 1 :], tools, checkpoint.tools, template_kwargs)
            if delta is not None:
                index.incremental += 1
                return PromptPlan(head=parent.prompt_ids, sampled=parent.output_ids, text=delta, prefix_digest=digest, parent_id=parent.id)
        index.full += 1
        drift = bool(assistant_at)
        index.drift += drift
        cached = self.cache.get(digest)
        if cached is not None:
            self.cache.move_to_end(digest)
            cached.holders.add(id(index))
            index.cached.add(digest)
            return PromptPlan(head=cached.ids, sampled=[], text="", prefix_digest=digest, drift=drift)
        return PromptPlan(
            head=[],
            sampled=[],
            text=self.render_text(messages, tools, True, template_kwargs),
            prefix_digest=digest,
            drift=drift,
            cache_key=digest,
        )

    def finish(self, plan: PromptPlan, ids: list[int], index: PromptIndex, *, cache: bool = True) -> Prompt:
        """The prompt of ``plan`` given ``ids`` = ids(plan.text); a full render is kept in the shared
        cache, held by ``index``'s session, when ``cache`` (the caller accepted the prompt)."""
        if plan.parent_id is not None:  # one exact-size copy of the history (``a + b + c`` would copy it twice)
            ids = plan.head + (plan.sampled + ids)
        elif plan.cache_key is None:  # a cache hit: a copy, so callers may keep it as their own
            ids = list(plan.head)
        elif cache:
            self._keep(plan.cache_key, ids, index)
            ids = list(ids)
        prompt = Prompt(ids=ids, prefix_digest=plan.prefix_digest, parent_id=plan.parent_id, drift=plan.drift)
        if self.template.thinks:  # only such templates pay for this decode (of a few ids)
            prompt.reasoning_open = self.decode(ids[-_THINK_TAIL:]).rstrip().endswith(THINK_OPEN)
        return prompt

    def _keep(self, digest: bytes, ids: list[int], index: PromptIndex) -> None:
        size = len(ids) * _ID_BYTES
        if size > self.cache_limit:
            return
        old = self.cache.pop(digest, None)  # two requests rendered it at once: one entry
        holders = {id(index)} if old is None else old.holders | {id(index)}
        if old is not None:
            self.cache_bytes -= len(old.ids) * _ID_BYTES
        self.cache[digest] = _Render(ids, holders)
        self.cache_bytes += size
        index.cached.add(digest)
        while len(self.cache) > _FULL_CACHE or self.cache_bytes > self.cache_limit:
            _, gone = self.cache.popitem(last=False)
            self.cache_bytes -= len(gone.ids) * _ID_BYTES

    def release(self, index: PromptIndex) -> None:
        """A session is done (closed or expired): drop what only it held, and its own caches."""
        for digest in index.cached:
            entry = self.cache.get(digest)
            if entry is not None:
                entry.holders.discard(id(index))
                if not entry.holders:
                    del self.cache[digest]
                    self.cache_bytes -= len(entry.ids) * _ID_BYTES
        index.cached.clear()
        index.heads.clear()
        index.history = None

    def record(self, index: PromptIndex, prompt: Prompt, interaction: Interaction, reply: dict) -> None:
        """Make ``interaction`` findable as the parent of calls that extend ``reply``."""
        key = reply_key(prompt.prefix_digest, reply)
        interaction.messages_hash = key
        index.by_key[key] = interaction.id

    def _extend(
        self,
        index: PromptIndex,
        parent: Interaction,
        lead: list[dict],
        reply: dict,
        new: list[dict],
        tools: list[dict] | None,
        tools_enc: bytes,
        template_kwargs: dict | None = None,
    ) -> str | None:
        """The text after the parent's prompt + sampled ids: the template's tail of the reply turn +
        the new messages; None when the template does not render the small context prefix-stably
        (or refuses it: the full render then answers for the request).
        ``lead``: the history's first messages through its first user message (``_lead_end``);
        ``tools_enc``: ``_encoder.encode`` of the keyed tools, already computed for the history hash."""
        render = self.template.renderer([*lead, reply, *new], tools, template_kwargs)
        n = len(lead)
        head_hash = hashlib.blake2b(tools_enc, digest_size=16)  # == prefix_digest(keyed tools, lead)
        head_hash.update(b"\x00")
        head_hash.update(_encoder.encode(lead))
        head_key = head_hash.digest()
        try:
            head = index.heads.get(head_key)
            if head is None:  # one entry per (tools, lead messages): usually one per session
                head = index.heads[head_key] = render(n, True)
            full = render(n + 1 + len(new), True)
            sampled = self.decode(parent.output_ids)
            if full.startswith(head) and full.startswith(sampled, len(head)):
                # The common case, in one render: the template writes the sampled text back verbatim, so
                # what follows it in this context is the reply turn's tail and the new messages.
                return full[len(head) + len(sampled) :]
            return self._rewritten_delta(render, n, head, full, parent)
        except TEMPLATE_ERRORS:  # deliberate: the full render raises it again, as the request's 400
            return None

    def _rewritten_delta(self, render: Callable[[int, bool], str], n: int, head: str, full: str, parent: Interaction) -> str | None:
        """The text after the sampled ids when the template does not write the sampled text back
        (it rewrites the content, e.g. drops reasoning) but the sampled tokens stand: what it writes
        after the reply turn's end (or the end itself, if none was sampled), then the new messages."""
        base = render(n + 1, False)
        if not base.startswith(head) or not full.startswith(base):
            return None
        turn = base[len(head) :]  # the reply's turn as the template writes it
        cut, eot = max((turn.rfind(e), e) for e in self.turn_ends)  # its last turn end
        if cut < 0:
            return None
        ended = bool(parent.output_ids) and parent.output_ids[-1] in self.stop_token_ids
        return (turn[cut + len(eot) :] if ended else turn[cut:]) + full[len(base) :]


def _chars_per_token(backend: Any) -> int | None:
    """The most characters of text one token can stand for, or None where this is not known: a
    byte-level BPE (no unknown token: every byte has one) with no normaliser or NFC, and added
    tokens that do not swallow whitespace beside them (lstrip/rstrip)."""
    if backend is None:
        return None
    try:
        pre = json.loads(backend.pre_tokenizer.__getstate__()) if backend.pre_tokenizer is not None else {}
        normalizer = json.loads(backend.normalizer.__getstate__()) if backend.normalizer is not None else {}
        model, added = backend.model, backend.get_added_tokens_decoder()
    except (AttributeError, TypeError, ValueError):
        return None
    steps = pre.get("pretokenizers") or [pre]
    if (
        type(model).__name__ != "BPE"
        or not any(step.get("type") == "ByteLevel" for step in steps)
        or normalizer.get("type", "NFC") != "NFC"
        or any(t.lstrip or t.rstrip for t in added.values())
    ):
        return None
    longest = max(map(len, backend.get_vocab(with_added_tokens=True)))
    return longest * (_NFC_SLACK if normalizer else 1)


def _lead_end(messages: list[dict], k: int) -> int:
    """End of the history's lead before message ``k``: through its first user message (else just the
    first message). Templates read more than the message they write: Llama 3.1 moves the tools into
    the first user message, Qwen3 keeps reasoning only after the last user query (and Qwen3.5 refuses
    a history without one), so the small context keeps the history's first user message."""
    for i in range(k):
        if messages[i].get("role") == "user":
            return i + 1
    return 1
