"""Arithmetic with a calculator tool served over MCP, shared by the taskset's rollouts (verifiers'
docs/v1/tasksets.md, "Adding Tools"): the harness offers the tool, runs the model's calls to it,
and the task scores the boxed answer of the last reply."""

import verifiers.v1 as vf

from vf_calculator.tools import CalculatorTools


class CalculatorData(vf.TaskData):
    answer: str


class CalculatorTask(vf.Task[CalculatorData]):
    @vf.reward
    async def boxed_answer(self, trace: vf.Trace) -> float:
        return float(vf.extract_boxed_answer(trace.last_reply or "") == self.data.answer)


class CalculatorConfig(vf.TasksetConfig):
    tools: vf.SharedToolsetConfig = vf.SharedToolsetConfig()


class CalculatorTaskset(vf.Taskset[CalculatorTask, CalculatorConfig]):
    def load(self) -> list[CalculatorTask]:
        return [
            CalculatorTask(
                CalculatorData(idx=0, prompt="Use the calculator: what is 6*7? Put the answer in \\boxed{}.", answer="42"),
                self.config.task,
            )
        ]

    @classmethod
    def toolsets(cls, config: CalculatorConfig) -> list[vf.Toolset]:
        return [CalculatorTools(config.tools)]


__all__ = ["CalculatorTaskset"]
