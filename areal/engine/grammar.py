"""Constrained decoding for the embedded engine: SGLang's constraint parameters, run by llguidance.

    sampling_params.json_schema | regex | ebnf | structural_tag      (at most one: SGLang's rule)
        │  HTTP side, off the event loop (``Grammars.attach``): compiled once per distinct text
        ▼  (a small LRU), validated against the served tokenizer, a fresh matcher per row
    worker, every step of a constrained row (batch.py):
        allowed = the matcher's token mask ─► logits[~allowed] = -inf ─► sample_next
        ─► matcher.consume_token(sampled) ─► the row ends when the grammar is complete

Invariants:
- A row's stop tokens (its ``stop_token_ids`` and, unless ``ignore_eos``, the model's EOS) are
  allowed exactly when the grammar accepts what was sampled so far: a row never ends on a stop
  token with its grammar incomplete, and once the grammar can take nothing more, a stop token is
  all it may sample (that last step's logprob is 0). A row that reaches ``max_new_tokens`` first
  finishes with "length", its output a prefix of a valid one, as any engine reports it. A row
  whose grammar is complete and that has no stop token to end it (``ignore_eos`` without
  ``stop_token_ids``) ends there, finish_reason ``{"type": "stop", "matched": null}``.
- The logprobs recorded (and the top logprobs) are those of the distribution actually sampled
  from: ``log_softmax(masked logits / temperature)``, the disallowed tokens at -inf and the rest
  renormalised; a top-logprobs entry of a disallowed token reads ``TOP_LOGPROB_FLOOR`` (vLLM's
  -9999.0, as JSON has no -inf). The trainer recomputes logprobs of the same tokens unmasked, so
  on a constrained row its ratio ``exp(trainer - behaviour)`` is at most 1 even with equal
  weights (a token the grammar forced has behaviour logprob 0 and a trainer logprob below it):
  a behaviour/trainer mismatch like any other, which ``trainer.rollout_correction``
  (areal/trainer/loss.py; ``token_tis`` weighs each token by that ratio) corrects for, and which
  ``logprob_max_diff`` reports.
- JSON (``json_schema``, and JSON schemas inside a structural tag) is written with ", " and ": "
  separators and no other whitespace (a schema's own ``"x-guidance"`` options override this), so
  a schema whose strings, arrays and numbers are bounded has a bounded reply.
- Added tokens (``<tool_call>``, ``</think>``, ...) count as single tokens: a structural tag's
  literal text that holds one is matched by that token, never spelled out in bytes.
- Whatever the matcher refuses at compile time (an invalid schema, regex or grammar, a tag of an
  unsupported type) is a ``RequestError`` naming ``sampling_params.<key>``: the server's 400.

Structural tags are xgrammar's format (``{"type": "structural_tag", "format": {...}}``), which
SGLang and vLLM take as they are; here they are compiled to llguidance's Lark. Covered element
types: ``const_string``, ``json_schema`` (style "json"), ``regex``, ``any_text`` (no ``excludes``),
``sequence``, ``or``, ``tag``. Not covered: the others (``triggered_tags``, ``tags_with_separator``,
token formats, XML styles, ``grammar``) and SGLang's legacy form (``structures`` + ``triggers``).
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from areal.engine.sampling import RequestError

ANY_JSON = "$$ANY$$"  # SGLang's json_schema for "any JSON value"
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
TOP_LOGPROB_FLOOR = -9999.0
CACHED_GRAMMARS = 64  # compiled matchers kept, by (key, text)


def _literal(text: str, added: dict[str, int]) -> str:
    """Lark for the exact ``text``: string literals, with each added token it holds as that token."""
    parts: list[str] = []
    at = 0
    while at < len(text):
        hit = min(((text.find(t, at), -len(t), t) for t in added if t and text.find(t, at) >= 0), default=None)
        end = len(text) if hit is None else hit[0]
        if end > at:
            parts.append(json.dumps(text[at:end], ensure_ascii=False))
        if hit is None:
            break
        parts.append(f"<[{added[hit[2]]}]>")
        at = hit[0] + len(hit[2])
    return " ".join(parts) if parts else '""'


def _json_schema(schema: Any) -> dict:
    """A schema with this engine's JSON layout unless it names its own (``x-guidance``)."""
    if schema is True or schema == {}:
        schema = {}
    if not isinstance(schema, dict):
        raise ValueError(f"a JSON schema must be an object, got {schema!r}")
    return schema if "x-guidance" in schema else {**schema, "x-guidance": JSON_STYLE}


def structural_tag_lark(tag: Any, added: dict[str, int]) -> str:
    """A structural tag (xgrammar's format) as an llguidance Lark grammar.
    ``added``: the tokenizer's added tokens by text. Raises ValueError saying what is unsupported."""
    if not isinstance(tag, dict):
        raise ValueError("a structural tag must be a JSON object")
    if tag.get("structures") is not None:  # SGLang's legacy form: free text, each trigger opening a structure
        raise ValueError('the legacy structural tag ("structures" + "triggers") is not supported by the embedded engine; use "format"')
    if "format" not in tag:
        raise ValueError('a structural tag needs "format" (or the legacy "structures" and "triggers")')
    return f"start: {_element(tag['format'], added)}\n"


def _element(fmt: Any, added: dict[str, int]) -> str:
    if not isinstance(fmt, dict):
        raise ValueError(f"a structural tag element must be an object, got {fmt!r}")
    kind = fmt.get("type")
    match kind:
        case "const_string":
            return _literal(str(fmt["value"]), added)
        case "json_schema":
            if fmt.get("style", "json") != "json":
                raise ValueError(f"json_schema style {fmt['style']!r} is not supported by the embedded engine (only 'json')")
            return "%json " + json.dumps(_json_schema(fmt["json_schema"]), ensure_ascii=False)
        case "regex":
            return "/" + str(fmt["pattern"]).replace("/", "\\/") + "/"
        case "any_text":
            if fmt.get("excludes"):
                raise ValueError("any_text excludes are not supported by the embedded engine")
            return "/(.|\\n)*/"
        case "sequence" | "or":
            parts = [_element(e, added) for e in fmt["elements"]]
            if not parts:
                raise ValueError(f"{kind} needs at least one element")
            return "(" + (" " if kind == "sequence" else " | ").join(parts) + ")"
        case "tag":
            ends = fmt["end"] if isinstance(fmt["end"], list) else [fmt["end"]]
            end = "(" + " | ".join(_literal(e, added) for e in ends) + ")"
            return f"({_literal(fmt['begin'], added)} {_element(fmt['content'], added)} {end})"
    raise ValueError(f"structural tag element type {kind!r} is not supported by the embedded engine")


class Grammars:
    """One engine's grammar compiler: the served tokenizer as llguidance sees it (built at the
    first constrained request), and compiled matchers by constraint text (their fresh state is
    deep-copied for each row). Thread-safe: requests compile off the loop, concurrently."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        self.tokenizer, self.vocab_size = tokenizer, vocab_size
        self._lock = threading.Lock()
        self._ll: Any = None
        self._added: dict[str, int] = {}
        self._cache: OrderedDict[tuple[str, str], Any] = OrderedDict()

    def _llg(self) -> Any:
        with self._lock:
            if self._ll is None:
                if self.tokenizer is None:
                    raise RequestError("constrained decoding needs a tokenizer in the model directory")
                try:
                    import llguidance.hf
                except ImportError as e:
                    raise RequestError(
                        f"constrained decoding needs the llguidance package (pip install areal-lite[structured]): {e}"
                    ) from e
                self._ll = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=self.vocab_size)
                self._added = {t: i for t, i in self.tokenizer.get_added_vocab().items() if i < self.vocab_size}
            return self._ll

    def matcher(self, key: str, text: str) -> Any:
        """A fresh matcher for one row; RequestError naming ``sampling_params.<key>``."""
        ll = self._llg()
        from llguidance import LLMatcher, grammar_from

        with self._lock:
            template = self._cache.get((key, text))
            if template is not None:
                self._cache.move_to_end((key, text))
                return template.deep_copy()
        try:
            if key == "json_schema":
                grammar = LLMatcher.grammar_from_json_schema(_json_schema({} if text == ANY_JSON else json.loads(text)))
            elif key == "regex":
                grammar = LLMatcher.grammar_from_regex(text)
            elif key == "ebnf":
                grammar = grammar_from("ebnf", text)
            else:
                grammar = LLMatcher.grammar_from_lark(structural_tag_lark(json.loads(text), self._added))
        except (ValueError, KeyError, TypeError) as e:  # json.JSONDecodeError is a ValueError
            raise RequestError(f"sampling_params.{key}: {e}") from None
        error = LLMatcher.validate_grammar(grammar, ll)
        if error:
            raise RequestError(f"sampling_params.{key}: {error.strip()}")
        template = LLMatcher(ll, grammar, log_level=0)
        if template.is_error():
            raise RequestError(f"sampling_params.{key}: {template.get_error()}")
        with self._lock:
            self._cache[(key, text)] = template
            while len(self._cache) > CACHED_GRAMMARS:
                self._cache.popitem(last=False)
            return template.deep_copy()

    @property
    def eos_ids(self) -> list[int]:
        """The EOS tokens the matchers know (they allow them once their grammar accepts)."""
        return list(self._ll.eos_tokens) if self._ll is not None else []

    def attach(self, rows: Sequence[Any]) -> None:
        """Give each row whose params carry a constraint its own matcher (``row.grammar``)."""
        for r in rows:
            if r.params.constraint is not None:
                r.grammar = self.matcher(*r.params.constraint)


def mask_logits(logits: torch.Tensor, matchers: Sequence[Any], stops: Sequence[frozenset[int]], eos_ids: Sequence[int]) -> None:
    """In place: each constrained row of ``logits`` (B, V) keeps only the tokens its matcher
    allows next (a None matcher: an unconstrained row, left whole). Its stop tokens are allowed
    exactly when the grammar accepts; the matcher's own EOS (``eos_ids``) only as one of them."""
    rows = [i for i, m in enumerate(matchers) if m is not None]
    vocab = logits.shape[-1]
    packed = np.frombuffer(b"".join(matchers[i].compute_bitmask() for i in rows), dtype=np.uint8).reshape(len(rows), -1)
    # one bit per token, little-endian in each byte; numpy's unpacking is ~10x torch's shifts here
    allowed = torch.from_numpy(np.unpackbits(packed, axis=1, bitorder="little")[:, :vocab].view(np.bool_))  # (R, V)
    allowed[:, [t for t in eos_ids if t < vocab]] = False
    for j, i in enumerate(rows):
        ends = [t for t in stops[i] if t < vocab]
        if ends:
            allowed[j, ends] = matchers[i].is_accepting()
    index = torch.tensor(rows)
    logits[index] = torch.where(allowed, logits[index], float("-inf"))  # where: ~2x masked_fill at 150k tokens


def advance(matcher: Any, token: int, stops: frozenset[int]) -> dict[str, Any] | None:
    """Feed a row's sampled ``token`` to its matcher; the finish_reason that ends the row here
    (its grammar failed, or is complete with no stop token to end it), else None."""
    if token in stops:
        return None  # the row ends on it (batch.py)
    if not matcher.consume_token(token):
        return {"type": "abort", "message": f"grammar: {matcher.get_error()}", "status_code": None, "err_type": None}
    if not stops and matcher.is_stopped():
        return {"type": "stop", "matched": None}
    return None
