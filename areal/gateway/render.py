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
once: when the render writes the sampled text back verbatim after the cached render of the first
message, everything after it is the reply turn's tail and the new messages; only a template that
rewrites the reply (drops reasoning, say) costs a second render to find the turn's end. So the
Python work of a turn does not grow with the history. What still touches the whole history runs at
C speed, once per turn: one msgspec encode of the messages, one memcmp against the previous call's
encoding, and one copy of the parent's ids into the new prompt list (``Interaction.prompt_ids`` is
a plain list that the engine call and every reader share; the copy, and the garbage collector's
walks over those lists, are the part of an episode that is quadratic). The hash itself is
incremental: the encoding of ``messages[:k]`` is a prefix of the encoding of ``messages``, and the
previous call's encoding (less its closing ``]``) is a prefix of this one's, so the session keeps
the hash state at that point (``HistoryHash``) and hashes only the new bytes; any other history
hashes from the start.

Rendering calls the tokenizer's compiled Jinja template directly with what
``apply_chat_template`` would pass it (None-valued keys dropped, reasoning aliases, plain data,
the special-tokens map), skipping its per-call wrapper; each message is prepared once per turn
for all of the turn's renders, and a tools list's template data is kept between turns (agents
send the same tools every turn; keyed by its order-preserving encoding). The template is compiled
in an overlay of transformers' sandboxed environment (``_compile_dict_first``) that answers
``message.role`` and ``loop.first`` without the sandbox's exception path, with the sandbox's own
answers. A probe conversation is rendered both ways at construction, and any difference (another
transformers version) falls back to ``apply_chat_template`` for good. Full renders (first turns,
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
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from types import MethodType
from typing import Any

import msgspec

from areal.gateway.pieces import PieceEncoder
from areal.gateway.tree import Interaction

_encoder = msgspec.json.Encoder(order="deterministic")
_ordered_encoder = msgspec.json.Encoder()  # keeps dict key order (the template sees it)
_TOOLS_CACHE = 64  # tools lists kept as template data, across sessions
_MAX_CANDIDATES = 4  # assistant messages tried as the parent's reply, newest first
_FULL_CACHE = 1024  # full renders kept (ids by digest), across sessions
_ID_BYTES = 36  # what one cached id costs: its list slot (8) + its int object (28; ids > 256 are not shared)
_TOOLS_CACHE_BYTES = 4 << 20  # tools lists kept, counted by their encodings (their template data is a few times that)
_NFC_SLACK = 4  # NFC composes at most 4 code points into one (the longest canonical decomposition)
_PROBE = [
    {"role": "system", "content": "s"},
    {"role": "user", "content": "u", "name": None},
    {"role": "assistant", "content": "a", "reasoning_content": "r"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"type": "function", "id": "c", "function": {"name": "f", "arguments": '{"x": 1}'}}],
    },
    {"role": "tool", "content": "t", "tool_call_id": "c"},
    {"role": "user", "content": "v"},
]
_DICT_ATTRIBUTES = frozenset(dir(dict))  # names getattr answers on a plain dict (its methods)
_MISSING = object()
_PROBE_TOOLS = [{"type": "function", "function": {"name": "f", "description": "d", "parameters": {"type": "object"}}}]


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
    heads: dict[bytes, str] = field(default_factory=dict)  # render([first message]) by H(tools, first)
    history: HistoryHash | None = None  # the last call's hash state (a cache: checked byte for byte)
    cached: set[bytes] = field(default_factory=set)  # digests of the shared full renders this session holds


@dataclass
class Prompt:
    ids: list[int]
    prefix_digest: bytes  # H(tools, messages) of this call, for the key of its replies
    parent_id: str | None = None
    drift: bool = False


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

    def __init__(self, tokenizer: Any, stop_token_ids: list[int], cache_bytes: int = 64 << 20) -> None:
        self.tokenizer = tokenizer
        self.stop_token_ids = set(stop_token_ids)
        eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
        if not isinstance(eos, int) or eos < 0 or eos == tokenizer.unk_token_id:
            eos = tokenizer.eos_token_id
        self.end_of_turn = tokenizer.convert_ids_to_tokens(eos)  # text the template closes a turn with
        # The Rust tokenizer directly: transformers' encode/decode wrappers cost ~10x more per call;
        # its batch call without offsets is a third cheaper again than ``encode`` (same ids).
        self._backend = getattr(tokenizer, "backend_tokenizer", None)
        self._encode_fast = getattr(self._backend, "encode_batch_fast", None)
        self._pieces = PieceEncoder.build(self._backend) if self._backend is not None else None
        self.cache: OrderedDict[bytes, _Render] = OrderedDict()  # full renders by digest, oldest first
        self.cache_bytes = 0  # ids in ``cache`` * _ID_BYTES
        self.cache_limit = cache_bytes
        self.chars_per_token = _chars_per_token(self._backend)  # None: no floor known for this tokenizer
        self._tools_cache: dict[bytes, list[Any]] = {}  # template data of a tools list, by its encoding
        self._tools_cache_bytes = 0
        self._templates: dict[bool, Any] = {}  # compiled template by "has tools"; empty: use the wrapper
        self._template_kwargs: dict[str, Any] = {}
        self._compile_templates()

    def _compile_templates(self) -> None:
        """Compiled templates for direct rendering, kept only if they render the probe exactly as
        ``apply_chat_template`` does, with tools and without."""
        try:
            from transformers.utils.chat_template_utils import _compile_jinja_template, _plain_template_data

            compiled = {
                has: _compile_jinja_template(self.tokenizer.get_chat_template(None, _PROBE_TOOLS if has else None)) for has in (False, True)
            }
        except (ImportError, AttributeError, ValueError, TypeError):  # no template, or another transformers
            return
        self._plain = _plain_template_data
        self._template_kwargs = _plain_template_data(dict(self.tokenizer.special_tokens_map))
        self._templates = {
            has: _compile_dict_first(t.environment, self.tokenizer.get_chat_template(None, _PROBE_TOOLS if has else None))
            for has, t in compiled.items()
        }
        for tools in (None, _PROBE_TOOLS):
            for n, gen in ((len(_PROBE), True), (3, False)):
                try:
                    ok = self.render_text(_PROBE[:n], tools, gen) == self._wrapper_text(_PROBE[:n], tools, gen)
                except Exception:  # a template that rejects the probe: no evidence, so no fast path
                    ok = False
                if not ok:
                    self._templates = {}
                    return

    def _wrapper_text(self, messages: list[dict], tools: list[dict] | None, generation: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False, add_generation_prompt=generation)

    def render_text(self, messages: list[dict], tools: list[dict] | None, generation: bool) -> str:
        return self._renderer(messages, tools)(len(messages), generation)

    def _renderer(self, messages: list[dict], tools: list[dict] | None) -> Callable[[int, bool], str]:
        """``render(n, generation)`` of ``messages[:n]``: each message is prepared once, for every render."""
        if not self._templates:
            return lambda n, generation: self._wrapper_text(messages[:n], tools, generation)
        plain = self._plain
        chat = [_template_message(m, plain) for m in messages]
        tools = self._template_tools(tools) if tools else None
        template = self._templates[tools is not None]
        kwargs = self._template_kwargs

        def render(n: int, generation: bool) -> str:
            return template.render(messages=chat[:n], tools=tools, documents=None, add_generation_prompt=generation, **kwargs)

        return render

    def _template_tools(self, tools: list[dict]) -> list[Any]:
        """``_plain_json(tools)``, kept by the tools' order-preserving encoding: an agent sends the
        same tools every turn, and their plain copy is most of a turn's preparation. Sharing one
        copy across renders is safe: the sandbox is immutable, so no template can change it."""
        key = _ordered_encoder.encode(tools)  # key order kept: ``tojson`` writes keys in order
        plain = self._tools_cache.get(key)
        if plain is None:
            plain = _plain_json(tools, self._plain)
            if len(key) > _TOOLS_CACHE_BYTES // 8:  # no agent's tools are this large: not worth an eighth of it
                return plain
            if len(self._tools_cache) >= _TOOLS_CACHE or self._tools_cache_bytes + len(key) > _TOOLS_CACHE_BYTES:
                self._tools_cache.clear()
                self._tools_cache_bytes = 0
            self._tools_cache[key] = plain
            self._tools_cache_bytes += len(key)
        return plain

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

    def full(self, messages: list[dict], tools: list[dict] | None) -> list[int]:
        return self.encode(self.render_text(messages, tools, True))

    def build(self, index: PromptIndex, interactions: dict[str, Interaction], messages: list[dict], tools: list[dict] | None) -> Prompt:
        """Prompt ids for ``messages``: on the parent's tokens when one matches, else a full render."""
        plan = self.plan(index, interactions, messages, tools)
        return self.finish(plan, self.encode(plan.text) if plan.text else [], index)

    def plan(self, index: PromptIndex, interactions: dict[str, Interaction], messages: list[dict], tools: list[dict] | None) -> PromptPlan:
        """Everything of ``build`` but tokenising the text that ends the prompt."""
        assistant_at = _newest_assistants(messages)
        digest, newest, checkpoint = _hash_history(tools, messages, assistant_at[0] if assistant_at else None, index.history)
        index.history = checkpoint
        for j, k in enumerate(assistant_at):
            head = newest if j == 0 else prefix_digest(tools, messages[:k])
            assert head is not None
            parent_id = index.by_key.get(reply_key(head, messages[k]))
            parent = interactions.get(parent_id) if parent_id is not None else None
            if parent is None:
                continue
            delta = self._extend(index, parent, messages[0], messages[k], messages[k + 1 :], tools, checkpoint.tools)
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
            head=[], sampled=[], text=self.render_text(messages, tools, True), prefix_digest=digest, drift=drift, cache_key=digest
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
        return Prompt(ids=ids, prefix_digest=plan.prefix_digest, parent_id=plan.parent_id, drift=plan.drift)

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
        self, index: PromptIndex, parent: Interaction, first: dict, reply: dict, new: list[dict], tools: list[dict] | None, tools_enc: bytes
    ) -> str | None:
        """The text after the parent's prompt + sampled ids: the template's tail of the reply turn +
        the new messages; None when the template does not render the small context prefix-stably.
        ``tools_enc``: ``_encoder.encode(tools)``, already computed for the history hash."""
        render = self._renderer([first, reply, *new], tools)
        head_hash = hashlib.blake2b(tools_enc, digest_size=16)  # == prefix_digest(tools, [first])
        head_hash.update(b"\x00")
        head_hash.update(_encoder.encode([first]))
        head_key = head_hash.digest()
        head = index.heads.get(head_key)
        if head is None:  # one entry per (tools, first message): usually one per session
            head = index.heads[head_key] = render(1, True)
        full = render(2 + len(new), True)
        sampled = self.decode(parent.output_ids)
        if full.startswith(head) and full.startswith(sampled, len(head)):
            # The common case, in one render: the template writes the sampled text back verbatim, so
            # what follows it in this context is the reply turn's tail and the new messages.
            return full[len(head) + len(sampled) :]
        return self._rewritten_delta(render, head, full, parent)

    def _rewritten_delta(self, render: Callable[[int, bool], str], head: str, full: str, parent: Interaction) -> str | None:
        """The text after the sampled ids when the template does not write the sampled text back
        (it rewrites the content, e.g. drops reasoning) but the sampled tokens stand: what it writes
        after the reply turn's end (or the end itself, if none was sampled), then the new messages."""
        base = render(2, False)
        if not base.startswith(head) or not full.startswith(base):
            return None
        turn = base[len(head) :]  # the reply's turn as the template writes it
        eot = self.end_of_turn
        if eot not in turn:
            return None
        ended = bool(parent.output_ids) and parent.output_ids[-1] in self.stop_token_ids
        cut = turn.rindex(eot)
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


def _template_message(message: dict, plain: Callable[[Any], Any]) -> dict:
    """What ``apply_chat_template`` hands the template for one message, in one pass: None-valued
    keys dropped, the reasoning aliases, plain JSON data (``_plain_json``)."""
    m = {k if type(k) is str else plain(k): v if type(v) is str else _plain_json(v, plain) for k, v in message.items() if v is not None}
    if "reasoning_content" in m or "thinking" in m or "reasoning" in m:
        reasoning = next(m[k] for k in ("reasoning_content", "thinking", "reasoning") if k in m)
        m = {"thinking": reasoning, **m, "reasoning_content": reasoning}
    return m


def _plain_json(value: Any, plain: Callable[[Any], Any]) -> Any:
    """``plain(value)`` (transformers' rebuild of template data out of JSON types), answered here for
    the exact JSON types a decoded request is made of: the same copy without a Python call and
    ABC check per leaf. Any other type (a str subclass, a dataclass, a pydantic model) goes to ``plain``."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if kind is dict:
        return {k if type(k) is str else plain(k): _plain_json(v, plain) for k, v in value.items()}
    if kind is list:
        return [_plain_json(v, plain) for v in value]
    return plain(value)


def _compile_dict_first(environment: Any, source: str) -> Any:
    """``source`` compiled in an overlay of a sandboxed Jinja environment, made cheaper per render.

    - ``getattr`` on a plain dict is one lookup. The sandbox resolves ``message.role`` as
      ``getattr(message, "role")``, which raises ``AttributeError`` for every dict key before it
      tries ``message["role"]``; the exceptions were most of a render's cost. For an exact ``dict``
      and a name that is not one of ``dict``'s attributes, the sandbox's answer is the item or
      ``undefined``, so answer that directly. Any other object or name (``message.items``,
      ``"x".strip``) takes the sandbox's path.
    - ``loop.first`` and friends likewise: for an exact ``LoopContext`` (no ``__getitem__``, none of
      the types or mutable ABCs the sandbox guards) and a name without a leading underscore, the
      sandbox's answer is the attribute or ``undefined``, after a dozen ``isinstance`` checks.
    - The template's globals are one flat dict instead of a ChainMap over the environment's: each
      render copies them into its context, and iterating a ChainMap is a Python loop per key. They
      are fixed when transformers compiles the template, so the snapshot is exact.
    """
    from jinja2.runtime import LoopContext

    overlay = environment.overlay()
    sandboxed = type(environment).getattr

    def getattr_dict_first(self: Any, obj: Any, attribute: str) -> Any:
        kind = type(obj)
        if kind is dict and attribute not in _DICT_ATTRIBUTES:
            value = obj.get(attribute, _MISSING)
        elif kind is LoopContext and attribute[:1] != "_":
            value = getattr(obj, attribute, _MISSING)
        else:
            return sandboxed(self, obj, attribute)
        return self.undefined(obj=obj, name=attribute) if value is _MISSING else value

    overlay.getattr = MethodType(getattr_dict_first, overlay)  # an instance attribute: only this overlay changes
    template = overlay.from_string(source)
    template.globals = dict(template.globals)
    return template
