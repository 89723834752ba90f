"""A taskset whose task has no @vf.reward: nothing scores its episodes."""

import verifiers.v1 as vf


class UnscoredTask(vf.Task[vf.TaskData]):
    pass


class UnscoredTaskset(vf.Taskset[UnscoredTask, vf.TasksetConfig]):
    def load(self) -> list[UnscoredTask]:
        return [UnscoredTask(vf.TaskData(idx=0, prompt="Say something."), self.config.task)]


__all__ = ["UnscoredTaskset"]
