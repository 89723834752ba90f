"""A multi-agent workflow on the OpenAI Agents SDK: a triage agent hands math to a calculator agent.

    Runner.run(triage) ── Responses API (the SDK's default) ──► gateway /v1/responses
      triage ──handoff: transfer_to_math_agent──► math agent ──function tool: calculator──► final output

The SDK runs the loop: tool calls, tool outputs and handoffs are items of the Responses input,
and every model call is one request the gateway records token by token. The math agent's tool
and instructions are the ones the embedded model was SFT-trained with, so it really calls
``calculator`` and the SDK really executes it. The reward is the math-answer verifier's verdict
on ``final_output``, whichever agent produced it.

The triage agent's ``tool_choice`` names the handoff: every question here is arithmetic. The
handoff tool takes no parameters, so the gateway writes the whole call (``{}`` arguments are the
only canonical ones) and the model samples only the end of its turn; the SDK then runs the math
agent, whose answer is rewarded. What the tiny embedded model cannot do well: it was never trained
on the handoff's history (a tool result naming the new agent), so the math agent's answers there
are worse than on a plain question. A mistake the SDK rejects (``ModelBehaviorError``: a call to a
tool the agent lacks; ``MaxTurnsExceeded``) scores 0 and its recorded calls are trained on, which
is how RL teaches a policy to recover.

Tracing is disabled: the SDK would upload traces to a remote host.
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from agents import Agent, MaxTurnsExceeded, ModelBehaviorError, ModelSettings, OpenAIProvider, RunConfig, Runner, handoff
from areal.reward.gsm8k import gsm8k_reward_fn
from areal.workflow.common import TOOL_SYSTEM_PROMPT, Sampling, gateway_kwargs, question
from areal.workflow.openai_agent.math_agent import calculator_tool  # the SDK function tool over the calculator


def build_triage_agent() -> Agent:
    """The triage agent, with one handoff: to the math agent that owns the calculator.

    Instructions stay short: the embedded model's context is 512 tokens, and every tool schema
    is rendered into the prompt.
    """
    math_agent = Agent(name="Math Agent", instructions=TOOL_SYSTEM_PROMPT, tools=[calculator_tool])
    return Agent(
        name="Triage Agent",
        instructions="Hand arithmetic problems to the math agent.",
        handoffs=[
            handoff(math_agent, tool_name_override="transfer_to_math_agent", tool_description_override="Solve an arithmetic problem")
        ],
        # Every question here is arithmetic, so triage must hand off: a named tool_choice. The
        # handoff takes no parameters, so the gateway writes the whole call (see module doc).
        model_settings=ModelSettings(tool_choice="transfer_to_math_agent"),
    )


class HandoffMathAgent:
    def __init__(self, max_turns: int = 4, temperature: float = 1.0, max_tokens: int = 64) -> None:
        self.sampling = Sampling(temperature=temperature, max_tokens=max_tokens, max_turns=max_turns)

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        client = AsyncOpenAI(**gateway_kwargs(extra_kwargs), max_retries=0)
        # OpenAIProvider's default is the Responses API: that is what this agent exercises.
        run_config = RunConfig(
            model_provider=OpenAIProvider(openai_client=client),
            tracing_disabled=True,
            model_settings=ModelSettings(temperature=self.sampling.temperature, max_tokens=self.sampling.max_tokens),
        )
        try:
            result = await Runner.run(build_triage_agent(), input=question(data), run_config=run_config, max_turns=self.sampling.max_turns)
        except (ModelBehaviorError, MaxTurnsExceeded):
            return 0.0  # a call to a tool this agent lacks, or no answer in max_turns: the policy's mistake
        return gsm8k_reward_fn(completions=str(result.final_output or ""), answer=data["answer"])
