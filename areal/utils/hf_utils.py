"""``load_hf_tokenizer(path)``: AReaL's tokenizer loader; ``"embedded"`` means the built-in model,
``"scripted"`` the built-in test model (replies fixed by contract, ``areal.embedded.scripted``),
``"embedded-agent"`` the calculator agent's variant (``areal.embedded.agentic``).
``apply_chat_template(tokenizer, messages, tokenize=True, **kwargs)``: AReaL's wrapper, ids as a
plain ``list[int]`` whatever the transformers version returns (a dict from 5.0 on)."""

from __future__ import annotations

from typing import Any

from areal.embedded.resolve import resolve_model_path  # noqa: F401  -- AReaL-era import path


def load_hf_tokenizer(path: str, fast_tokenizer: bool = True, padding_side: str | None = None) -> Any:
    """The HF tokenizer of a model directory (or of the embedded model for ``"embedded"``)."""
    from transformers import AutoTokenizer  # deferred: importing transformers costs ~0.7 s

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(path), use_fast=fast_tokenizer)
    if padding_side is not None:
        tokenizer.padding_side = padding_side
    if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def apply_chat_template(tokenizer: Any, messages: list[dict[str, Any]], *, tokenize: bool = True, **kwargs: Any) -> list[int] | str:
    """The chat template applied to ``messages``: token ids when ``tokenize``, else the text."""
    result = tokenizer.apply_chat_template(messages, tokenize=tokenize, **kwargs)
    if tokenize and not isinstance(result, list):  # transformers >= 5.0: a BatchEncoding
        return list(result["input_ids"])
    return result
