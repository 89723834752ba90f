"""Math agent on the Anthropic SDK (``AsyncAnthropic`` pointed at the gateway's Messages API).

The Anthropic SDK appends ``/v1/messages`` to its base URL itself, so the gateway's ``/v1``
suffix is removed from ``base_url`` (in the sandbox ``ANTHROPIC_BASE_URL`` is already bare). The
runner's ``http_client`` is passed as it is, as AReaL's agent does: anthropic >= 2.11 (httpx2)
gets a bridge to it (``areal/agent/httpx2_bridge.py``).
"""

from __future__ import annotations

import os
from typing import Any

from anthropic import AsyncAnthropic

from areal.api.workflow_api import AgentWorkflow
from areal.workflow.common import SamplingKwargs, gateway_kwargs, math_reward, question


class MathAgent(SamplingKwargs, AgentWorkflow):
    MAX_TURNS = 1

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        if extra_kwargs.get("base_url") or not os.environ.get("ANTHROPIC_BASE_URL"):
            gw = gateway_kwargs(extra_kwargs)
            base_url = gw["base_url"].rstrip("/").removesuffix("/v1")
            client = AsyncAnthropic(base_url=base_url, api_key=gw["api_key"], http_client=gw["http_client"], max_retries=0)
        else:
            client = AsyncAnthropic(max_retries=0)  # ANTHROPIC_BASE_URL / ANTHROPIC_API_KEY from the sandbox
        message = await client.messages.create(
            model="default",
            max_tokens=self.sampling.call_tokens(),
            messages=[{"role": "user", "content": question(data)}],
            # anthropic 2.x dropped the keywords; the API keeps the fields
            extra_body={"temperature": self.sampling.temperature, "top_p": self.sampling.top_p},
        )
        text = "".join(block.text for block in message.content if block.type == "text")
        return await math_reward(completions=text, answer=data["answer"])
