"""Math agents on the OpenAI Agents SDK: ``build_math_agent`` (the guide's multi-agent builder),
``build_calculator_agent`` (one agent with a function tool) and ``MathAgent`` (runs a builder).

``build_math_agent()`` is the OpenAI Agents guide's coordinator with handoffs to a problem
analyzer and a solution specialist; ``agent_builder_path`` names it in
``examples/openai-agents/config.yaml``. ``MathAgent`` is the same run as an ``AgentWorkflow``
(``workflow=areal.workflow.openai_agent.math_agent.MathAgent``): an ``AsyncOpenAI`` client on
the gateway, the SDK's default Responses API, tracing off (it would upload to a remote host).
"""

from __future__ import annotations

from typing import Any

from openai import AsyncOpenAI

from agents import Agent, ModelSettings, OpenAIProvider, RunConfig, Runner, function_tool, handoff
from agents.extensions.handoff_prompt import RECOMMENDED_PROMPT_PREFIX
from areal.api.workflow_api import AgentWorkflow
from areal.utils.dynamic_import import import_from_string
from areal.workflow.common import TOOL_SYSTEM_PROMPT, SamplingKwargs, calculator, gateway_kwargs, math_reward, question


def build_math_agent(recommended_prefix: bool = False) -> Agent:
    """A coordinator that may hand a problem to an analyzer or a solver; answers in ``\\boxed{}``.

    The SDK's ``RECOMMENDED_PROMPT_PREFIX`` (562 characters) is off by default: with the embedded
    model's small vocabulary it alone costs ~300 tokens of a 512-token context. Turn it on
    (``agent_builder_kwargs: {recommended_prefix: true}``) for real models.
    """
    prefix = f"{RECOMMENDED_PROMPT_PREFIX}\n" if recommended_prefix else ""
    analyzer = Agent(
        name="Problem Analyzer", instructions=f"{prefix}Find the quantities and the operation, then solve. End with \\boxed{{answer}}."
    )
    solver = Agent(name="Solution Specialist", instructions=f"{prefix}Solve step by step. End with \\boxed{{answer}}.")
    return Agent(
        name="Math Problem Solver",
        instructions=f"{prefix}Solve the problem or hand it off. End with \\boxed{{answer}}.",
        handoffs=[
            handoff(agent=analyzer, tool_name_override="analyze_problem", tool_description_override="Analyze the problem"),
            handoff(agent=solver, tool_name_override="solve_problem", tool_description_override="Solve step by step"),
        ],
    )


@function_tool(name_override="calculator")
def calculator_tool(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * and parentheses.

    Args:
        expression: e.g. 23*7
    """
    return calculator(expression)


def build_calculator_agent() -> Agent:
    """One agent with the embedded model's calculator as a function tool."""
    return Agent(name="Calculator Agent", instructions=TOOL_SYSTEM_PROMPT, tools=[calculator_tool])


class MathAgent(SamplingKwargs, AgentWorkflow):
    """Runs the agent ``agent_builder_path`` builds; the reward is the final output's. The other
    keywords are the sampling ones (``SamplingKwargs``)."""

    def __init__(
        self,
        agent_builder_path: str = "areal.workflow.openai_agent.math_agent.build_math_agent",
        agent_builder_kwargs: dict[str, Any] | None = None,
        **sampling: Any,
    ) -> None:
        super().__init__(**sampling)
        self.builder = import_from_string(agent_builder_path)
        self.builder_kwargs = dict(agent_builder_kwargs or {})

    async def run(self, data: dict[str, Any], **extra_kwargs: Any) -> float:
        client = AsyncOpenAI(**gateway_kwargs(extra_kwargs), max_retries=0)
        run_config = RunConfig(
            model_provider=OpenAIProvider(openai_client=client),
            tracing_disabled=True,
            model_settings=ModelSettings(
                temperature=self.sampling.temperature, top_p=self.sampling.top_p, max_tokens=self.sampling.call_tokens()
            ),
        )
        result = await Runner.run(
            self.builder(**self.builder_kwargs), input=question(data), run_config=run_config, max_turns=self.sampling.max_turns
        )
        return await math_reward(completions=str(result.final_output or ""), answer=data["answer"])


class MathToolAgent(MathAgent):
    def __init__(self, **kwargs: Any) -> None:
        super().__init__(agent_builder_path="areal.workflow.openai_agent.math_agent.build_calculator_agent", **kwargs)
