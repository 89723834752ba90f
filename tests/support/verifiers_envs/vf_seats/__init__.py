"""Two seats, each in a two-turn interaction that the env drives as the user, each trace rewarded
by its seat: ``first`` 0.25, ``second`` 0.75, whatever the model writes, so a test can tell whose
calls got which reward. Every seat's prompt names its seat (SEAT_MARK)."""

import verifiers.v1 as vf

SEAT_MARK = "You are seat {seat}."
SEAT_REWARD = {"first": 0.25, "second": 0.75}


class SeatsTask(vf.Task[vf.TaskData]):
    pass


class SeatsTaskset(vf.Taskset[SeatsTask, vf.TasksetConfig]):
    def load(self) -> list[SeatsTask]:
        return [SeatsTask(vf.TaskData(idx=i, prompt=f"Name a number from 1 to {i + 3}."), self.config.task) for i in range(8)]


class SeatsEnvConfig(vf.EnvConfig):
    first: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})
    second: vf.AgentConfig = vf.AgentConfig(harness={"id": "null"})


class SeatsEnv(vf.Env[SeatsEnvConfig]):
    async def run(self, task: vf.Task, agents: vf.Agents) -> None:
        for seat in ("first", "second"):
            own = vf.Task(vf.TaskData(idx=task.data.idx, prompt=None, system_prompt=SEAT_MARK.format(seat=seat)))
            async with getattr(agents, seat).interaction(own) as interaction:
                segment = await interaction.turn(task.data.prompt_text)
                if not segment.terminated:
                    await interaction.turn("And another one?")
            interaction.trace.record_reward("seat", SEAT_REWARD[seat])


__all__ = ["SeatsEnv", "SeatsTaskset"]
