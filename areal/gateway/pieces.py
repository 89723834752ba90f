"""Exact token ids for prompt text, from cached pieces: the gateway's fast path to the tokenizer.

``PromptBuilder`` (render.py) tokenises only the new messages of each turn, and those are mostly
template text that repeats every turn (role headers, the end-of-turn "\n", the generation
prompt) plus short contents made of common words. ``PieceEncoder`` returns exactly the ids the
tokenizer returns for a text, from caches keyed by those repeats; where it cannot be exact it is
not built at all and the caller uses the tokenizer.

Invariant: ``PieceEncoder.encode(text) == tokenizer.encode(text, add_special_tokens=False)`` for
every text (tests compare them on random texts for the embedded and the Qwen2.5 tokenizers, and
``build`` refuses any pipeline it does not reproduce, checked again by a probe at start-up).
Covered: Qwen2-style byte-level BPE (the embedded model and Qwen2.5). Not covered: other
pre-tokenizers (SentencePiece, Llama-3's pattern): they use the tokenizer as before.
"""

from __future__ import annotations

import json
from typing import Any

# The Qwen2 pre-tokenizer's split pattern (the embedded vocabulary and Qwen2.5 use it).
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_PIECE_CACHE = 4096  # pieces (text between added tokens) kept, each at most _PIECE_CHARS long
_PIECE_CHARS = 48
_WORD_CACHE = 65536  # pre-tokenized words kept with their BPE ids
_ENCODER_PROBE = "".join(map(chr, range(128))) + " x  y\t\n\n z \r\n'S 'll I'M we've  \n  12345 a.b!!\n?? {\"expr\": \"3*4\"}\n  \n\tend "


class PieceEncoder:
    """The tokenizer's ids for a text, from cached pieces: what its Rust pipeline computes, cheaper.

    A tokenizer splits the text at its added tokens first (``<|im_start|>``, ``<tool_call>``, ...)
    and normalises, pre-tokenises and BPE-encodes each piece between them on its own, so ids(text)
    is the concatenation of the pieces' ids. Two caches follow from that:

    - short pieces that recur (the "\\n" after a turn's end, the generation prompt) are encoded once;
    - an ASCII piece is split into words here with the same pattern (the ``regex`` module runs it
      ~2.5x faster than the tokenizer's Oniguruma), and each word's BPE ids are cached (a miss asks
      the tokenizer's own BPE model for that word). Non-ASCII pieces go to the tokenizer whole, so
      Unicode property tables never have to agree.

    Built only for the pipeline it reproduces (NFC or no normaliser, the Qwen2 split + byte-level
    pre-tokenizer, BPE, no truncation or padding, added tokens without strip/word/normalised
    flags), and kept only if a probe over every ASCII character encodes exactly as the tokenizer
    does; ``build`` returns None otherwise, and the caller uses the tokenizer.
    """

    def __init__(self, backend: Any, split: Any, specials: dict[str, int], byte_chars: dict[int, str]) -> None:
        import re

        self._backend = backend
        self._bpe = backend.model
        self._split = split.findall
        self._special_ids = specials
        longest_first = sorted(specials, key=len, reverse=True)  # leftmost-longest, as the tokenizer matches
        self._specials = re.compile("(" + "|".join(map(re.escape, longest_first)) + ")") if specials else None
        self._byte_chars = byte_chars  # str.translate table: ASCII byte -> its byte-level character
        self._pieces: dict[str, list[int]] = {}
        self._seen: set[str] = set()  # short pieces met once (see ``_keep_piece``)
        self._words: dict[str, list[int]] = {}

    @classmethod
    def build(cls, backend: Any) -> PieceEncoder | None:
        """The encoder for ``backend`` (a ``tokenizers.Tokenizer``), or None where it would not be exact."""
        try:  # each component's own JSON: the whole tokenizer's (its vocabulary) costs ~0.6 s for Qwen2.5
            import regex
            from tokenizers import pre_tokenizers

            pre = json.loads(backend.pre_tokenizer.__getstate__()) if backend.pre_tokenizer is not None else {}
            normalizer = json.loads(backend.normalizer.__getstate__()) if backend.normalizer is not None else {}
            model, truncation, padding = backend.model, backend.truncation, backend.padding
        except (ImportError, AttributeError, TypeError, ValueError):
            return None
        steps = pre.get("pretokenizers") or []
        if (
            pre.get("type") != "Sequence"
            or len(steps) != 2
            or normalizer.get("type", "NFC") != "NFC"
            or steps[0] != {"type": "Split", "pattern": {"Regex": _QWEN2_SPLIT}, "behavior": "Isolated", "invert": False}
            or steps[1].get("type") != "ByteLevel"
            or steps[1].get("add_prefix_space")
            or steps[1].get("use_regex")
            or type(model).__name__ != "BPE"
            or model.dropout
            or truncation
            or padding
            or getattr(backend, "encode_special_tokens", False)
        ):
            return None
        added = backend.get_added_tokens_decoder()
        if any(t.lstrip or t.rstrip or t.single_word or t.normalized for t in added.values()):
            return None
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        byte_chars = {b: byte_level.pre_tokenize_str(chr(b))[0][0] for b in range(128)}
        encoder = cls(backend, regex.compile(_QWEN2_SPLIT), {t.content: i for i, t in added.items()}, byte_chars)
        probe = _ENCODER_PROBE + "".join(added[i].content + _ENCODER_PROBE[i % 97 :] for i in sorted(added))
        for text in (probe, _ENCODER_PROBE[::-1], probe[::3]):
            if encoder.encode(text) != backend.encode(text, add_special_tokens=False).ids:
                return None
        encoder._pieces.clear()  # the probe's pieces are not worth their slots
        encoder._seen.clear()
        return encoder

    def encode(self, text: str) -> list[int]:
        ids: list[int] = []
        pieces = self._specials.split(text) if self._specials is not None else [text]
        for i, piece in enumerate(pieces):  # odd indices: the added tokens the split captured
            if i & 1:
                ids.append(self._special_ids[piece])
                continue
            if not piece:
                continue
            cached = self._pieces.get(piece)
            if cached is None:
                cached = self._encode_piece(piece)
                if len(piece) <= _PIECE_CHARS:
                    self._keep_piece(piece, cached)
            ids += cached
        return ids

    def _keep_piece(self, piece: str, ids: list[int]) -> None:
        """Keep a short piece from its second sighting on: template pieces repeat every turn, while
        most short message contents never come back and would only churn the cache."""
        if piece not in self._seen:
            if len(self._seen) >= _PIECE_CACHE:
                self._seen.clear()
            self._seen.add(piece)
            return
        if len(self._pieces) >= _PIECE_CACHE:
            self._pieces.clear()
        self._pieces[piece] = ids

    def _encode_piece(self, piece: str) -> list[int]:
        if not piece.isascii():  # NFC and the split pattern's Unicode classes: the tokenizer's own
            return self._backend.encode_batch_fast([piece], add_special_tokens=False)[0].ids
        ids: list[int] = []
        words = self._words
        for word in self._split(piece):
            word_ids = words.get(word)
            if word_ids is None:
                word_ids = [t.id for t in self._bpe.tokenize(word.translate(self._byte_chars))]
                if len(words) >= _WORD_CACHE:
                    words.clear()
                words[word] = word_ids
            ids += word_ids
        return ids
