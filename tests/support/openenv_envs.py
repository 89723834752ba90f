"""OpenEnv environments for tests/integration/agents/test_openenv_env.py, written as a user writes
one on ``openenv-core`` (an ``Environment[Action, Observation, State]`` subclass), each ending, or
failing, the same way whatever the model writes.

- ``CountingEnv``: three moves; move k is rewarded ``REWARD_STEP * k``; each observation repeats
  the previous move (``SAID``) and the first names the episode's seed: what the model wrote
  reached the env, whose state lives in the episode's process.
- ``UnscoredEnv``: ends after one move with no reward. ``NanEnv``: one move rewarded NaN.
  ``EndlessEnv``: never ends.
- ``UndeclaredEnv``: no action type declared. ``TwoTextEnv``: an action with two str fields.
"""

from __future__ import annotations

import math

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

REWARD_STEP = 0.25
MOVES = 3
SAID = "You said: "


class Say(Action):
    message: str


class Prompt(Observation):
    prompt: str
    turn: int = 0


class CountingEnv(Environment[Say, Prompt, State]):
    def __init__(self, moves: int = MOVES) -> None:
        super().__init__()
        self.moves = moves
        self._state = State()

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs) -> Prompt:
        self._state = State(episode_id=episode_id)
        return Prompt(prompt=f"Turn 0 of {self.moves}, seed {seed}. Say anything.")

    def step(self, action: Say, timeout_s: float | None = None, **kwargs) -> Prompt:
        self._state.step_count += 1
        turn = self._state.step_count
        return Prompt(
            prompt=f"Turn {turn} of {self.moves}. {SAID}{action.message}", turn=turn, reward=REWARD_STEP * turn, done=turn == self.moves
        )

    @property
    def state(self) -> State:
        return self._state


class OneMoveEnv(CountingEnv):
    reward: float | None = None

    def step(self, action: Say, timeout_s: float | None = None, **kwargs) -> Prompt:
        return Prompt(prompt="over", reward=self.reward, done=True)


class UnscoredEnv(OneMoveEnv):
    reward = None


class NanEnv(OneMoveEnv):
    reward = math.nan


class EndlessEnv(CountingEnv):
    def step(self, action: Say, timeout_s: float | None = None, **kwargs) -> Prompt:
        return Prompt(prompt="again", reward=0.0)


class UndeclaredEnv(Environment):
    def reset(self, seed=None, episode_id=None, **kwargs):
        return Prompt(prompt="")

    def step(self, action, timeout_s=None, **kwargs):
        return Prompt(prompt="", done=True)

    @property
    def state(self) -> State:
        return State()


class TwoText(Action):
    message: str
    note: str = ""


class TwoTextEnv(CountingEnv, Environment[TwoText, Prompt, State]):
    pass
