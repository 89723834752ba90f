"""TextArena games registered for tests/integration/agents/test_textarena_env.py: importing this
module registers them (a sandboxed zygote imports it with ``sandbox.preload``). Each ends, or fails,
the same way whatever the model writes.

- ``AreaLTestAlternate-v0``: two players, every move accepted, four moves; player 0 wins (1, -1).
- ``AreaLTestEndless-v0``: one player, never ends.
- ``AreaLTestNanReward-v0``: one player, ends after one move with the reward NaN.
"""

from __future__ import annotations

import math

import textarena as ta

SEAT_PROMPT = "You are Player {player} of the alternating test game. Say anything."


class Alternate(ta.Env):
    def reset(self, num_players: int, seed: int | None = None) -> None:
        self.state = ta.TwoPlayerState(num_players=num_players, seed=seed)
        self.state.reset(game_state={}, player_prompt_function=lambda player_id, game_state: SEAT_PROMPT.format(player=player_id))

    def step(self, action: str) -> tuple[bool, dict]:
        if self.state.turn == 3:
            self.state.set_winner(player_id=0, reason="four moves made")
        return self.state.step()


class OnePlayer(ta.Env):
    def __init__(self, reward: float | None = None) -> None:
        self.reward = reward  # None: the game never ends

    def reset(self, num_players: int, seed: int | None = None) -> None:
        self.state = ta.SinglePlayerState(num_players=num_players, seed=seed)
        self.state.reset(game_state={}, player_prompt_function=lambda player_id, game_state: "Say anything.")

    def step(self, action: str) -> tuple[bool, dict]:
        if self.reward is not None:
            self.state.set_outcome(reward=self.reward, reason="one move")
        return self.state.step()


WRAPPERS = [ta.wrappers.LLMObservationWrapper]  # as TextArena's own games: each observation the game so far, as text
ta.register(id="AreaLTestAlternate-v0", entry_point=Alternate, default_wrappers=WRAPPERS)
ta.register(id="AreaLTestEndless-v0", entry_point=OnePlayer, default_wrappers=WRAPPERS)
ta.register(id="AreaLTestNanReward-v0", entry_point=OnePlayer, default_wrappers=WRAPPERS, reward=math.nan)
