"""Math agent on the Anthropic SDK (``AsyncAnthropic`` pointed at the gateway's Messages API).

The Anthropic SDK appends ``/v1/messages`` to its base URL itself, so the gateway's ``/v1``
suffix is removed from ``base_url`` (in the sandbox ``ANTHROPIC_BASE_URL`` is already bare).
"""

from __future__ import annotations

import os
from typing import Any

from anthropic import AsyncAnthropic

from areal.api.workflow_api import AgentWorkflow
from areal.workflow.common import gateway_kwargs, math_reward, question


def anthropic_http_client(client: Any) -> Any:
    """``client`` if the Anthropic SDK accepts it, else None (the SDK then makes its own, to the
    same ``base_url``). anthropic >= 2.11 is built on ``httpx2`` and refuses the ``httpx`` client the
    runners hand every agent for the OpenAI-style SDKs."""
    try:
        import httpx2
    except ImportError:  # an anthropic built on httpx takes the httpx client
        return client
    return client if isinstance(client, httpx2.AsyncClient) else None


class MathAgent(AgentWorkflow):
    def __init__(self, temperature: float = 1.0, max_tokens: int = 64) -> None:
        self.temperature, self.max_tokens = temperature, max_tokens

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        if extra_kwargs.get("base_url") or not os.environ.get("ANTHROPIC_BASE_URL"):
            gw = gateway_kwargs(extra_kwargs)
            base_url = gw["base_url"].rstrip("/").removesuffix("/v1")
            client = AsyncAnthropic(
                base_url=base_url, api_key=gw["api_key"], http_client=anthropic_http_client(gw["http_client"]), max_retries=0
            )
        else:
            client = AsyncAnthropic(max_retries=0)  # ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY from the sandbox
        message = await client.messages.create(
            model="default",
            max_tokens=self.max_tokens,
            messages=[{"role": "user", "content": question(data)}],
            extra_body={"temperature": self.temperature},  # anthropic 2.x dropped the keyword; the API keeps the field
        )
        text = "".join(block.text for block in message.content if block.type == "text")
        return await math_reward(completions=text, answer=data["answer"])
