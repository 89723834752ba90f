"""``AReaLOpenAICompatibleModel``: a CAMEL model backend over an ``ArealOpenAI`` (or any OpenAI) client.

    ChatAgent(model=AReaLOpenAICompatibleModel(openai_client=client, tokenizer=tok, model_type="areal"))
        └─ agent.astep(...) ─► CAMEL's OpenAICompatibleModel._arun ─► client.chat.completions.create
                                  (ArealOpenAI: recorded token by token in the client's session)

A thin subclass of CAMEL's own ``OpenAICompatibleModel`` (camel-ai 0.2.90): the given client is
passed through as CAMEL's ``async_client`` (an ``AsyncOpenAI``, like ``ArealOpenAI``) or
``client`` (a sync ``OpenAI``), so requests, tools, streaming and structured output keep CAMEL's
behaviour. What it adds:

- an offline token counter from the policy's own tokenizer (CAMEL's default counter downloads a
  tiktoken encoding, and counts another model's tokens anyway);
- a context window from the tokenizer, not CAMEL's table of known model names ("areal" is not
  one, and it would warn on every call);
- a clear error when the synchronous ``step()`` is used with an async-only client (ArealOpenAI
  answers in the caller's event loop; use ``astep``).

Not covered: the counter's per-message overhead is the ChatML framing of the embedded and Qwen
templates (4 tokens); other templates are close, not exact. CAMEL uses the count only to trim
history against the context window.
"""

from __future__ import annotations

import json
from typing import Any

from camel.models import OpenAICompatibleModel
from camel.utils import BaseTokenCounter
from openai import AsyncOpenAI, OpenAI

CHATML_OVERHEAD = 4  # <|im_start|> role \n ... <|im_end|> \n around each message
DEFAULT_CONTEXT = 32768  # when the tokenizer does not state a usable model_max_length


class TokenizerCounter(BaseTokenCounter):
    """CAMEL's token counter over an HF tokenizer: no download, the policy's own tokens."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer

    def count_tokens_from_messages(self, messages: list[dict[str, Any]]) -> int:
        total = 0
        for m in messages:
            content = m.get("content") or ""
            if isinstance(content, list):  # content parts: only the text parts reach the model here
                content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
            text = str(content)
            if m.get("tool_calls"):
                text += json.dumps(m["tool_calls"], default=str)
            total += len(self.encode(text)) + CHATML_OVERHEAD
        return total

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, token_ids: list[int]) -> str:
        return self.tokenizer.decode(token_ids)


class AReaLOpenAICompatibleModel(OpenAICompatibleModel):
    """CAMEL model backend whose every call goes through ``openai_client`` (e.g. ``ArealOpenAI``)."""

    def __init__(
        self,
        openai_client: AsyncOpenAI | OpenAI,
        tokenizer: Any,
        model_type: str = "areal",
        model_config_dict: dict[str, Any] | None = None,
        token_limit: int | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(openai_client, AsyncOpenAI):
            sync_client, async_client = _AsyncOnly(), openai_client
        elif isinstance(openai_client, OpenAI):
            sync_client, async_client = openai_client, _SyncOnly()
        else:
            raise TypeError(
                f"openai_client must be an openai.AsyncOpenAI (e.g. ArealOpenAI) or openai.OpenAI, got {type(openai_client).__name__}"
            )
        if token_limit is not None and token_limit <= 0:
            raise ValueError(f"token_limit must be positive, got {token_limit}")
        # CAMEL would read OPENAI_COMPATIBILITY_* from the environment; the client already knows
        # where to go, so the key and URL only fill CAMEL's own bookkeeping.
        super().__init__(
            model_type=model_type,
            model_config_dict=model_config_dict,
            api_key=openai_client.api_key or "areal",
            url=str(openai_client.base_url),
            token_counter=TokenizerCounter(tokenizer),
            max_retries=0,
            client=sync_client,
            async_client=async_client,
            **kwargs,
        )
        self.openai_client = openai_client
        self.tokenizer = tokenizer
        limit = getattr(tokenizer, "model_max_length", None)
        self._token_limit = token_limit or (limit if isinstance(limit, int) and 0 < limit < 10**8 else DEFAULT_CONTEXT)

    @property
    def token_limit(self) -> int:
        return self._token_limit


class _AsyncOnly:
    """Stands in for CAMEL's sync client when only an async one was given: says what to do."""

    def __getattr__(self, name: str) -> Any:
        raise TypeError(
            "this AReaLOpenAICompatibleModel wraps an async client (ArealOpenAI answers in the caller's event loop): "
            "use ChatAgent.astep(...) instead of step(...)"
        )


class _SyncOnly:
    """Stands in for CAMEL's async client when only a sync one was given."""

    def __getattr__(self, name: str) -> Any:
        raise TypeError(
            "this AReaLOpenAICompatibleModel wraps a sync openai.OpenAI client: use ChatAgent.step(...), "
            "or pass an AsyncOpenAI / ArealOpenAI for astep(...)"
        )
