"""A taskset whose reward is NaN."""

import verifiers.v1 as vf


class NanTask(vf.Task[vf.TaskData]):
    @vf.reward
    async def broken(self, trace: vf.Trace) -> float:
        return float("nan")


class NanTaskset(vf.Taskset[NanTask, vf.TasksetConfig]):
    def load(self) -> list[NanTask]:
        return [NanTask(vf.TaskData(idx=0, prompt="Say something."), self.config.task)]


__all__ = ["NanTaskset"]
