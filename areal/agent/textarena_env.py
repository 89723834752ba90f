"""A TextArena game as the agent (``rollout.agent=textarena:GAME``): the game's own reset/step loop
in the episode's process, the model making every move through the gateway.

    rollout.agent=textarena:GuessTheNumber-v0
    rollout.agent=textarena:TicTacToe-v0 +rollout.agent_kwargs.num_players=2   # self-play

    row {seed}  ─► ta.make(GAME); reset(num_players, seed)          the game's state: this process's
    loop:          player, observation = get_observation()
                   call ─► gateway: [system: TextArena's game prompt, user: observation] ─► move
                   done = step(move)                                 (the move the call made, recorded)
    end:           rewards, info = close()  ─►  {completion_id: reward of the player who made that move}

Each move is one Chat Completions call, shaped as TextArena's own agents make it (its
``STANDARD_GAME_PROMPT`` as the system message, the observation its default wrappers render, the
whole game so far, as the user message). TextArena scores a game once, at its end, per player:
every call gets the reward of the player whose move it made, so in self-play the winner's moves
and the loser's moves are trained with their own rewards. The game is seeded from the row's
``seed`` (else from the row's text), so the samples of one prompt play the same game.

Invariants: at most ``max_moves`` calls; a game that has not ended by then is an error (no reward
is guessed); a game unknown to TextArena's registry, a player count the game refuses, and rewards
that are not a finite number for every player are errors naming the game.

What is covered: TextArena's registered games that run offline (the word games download NLTK
corpora at reset, and the ones judged by a model call OpenRouter: neither works in a sandbox with no
network). What is not: TextArena's online play, per-turn shaping (TextArena scores only the end),
OpenEnv servers.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

PREFIX = "textarena:"
INSTALL = "pip install 'areal-lite[envs]' (or pip install textarena==0.7.4; make installs it from requirements.lock)"


@dataclasses.dataclass(frozen=True)
class GameConfig:
    """``rollout.agent_kwargs`` of a TextArena agent."""

    num_players: int = 1  # the model plays every seat
    max_moves: int = 64  # the most calls an episode makes; a game still running after them is an error
    max_tokens: int = 64  # the limit of one move's completion
    temperature: float = 1.0

    def __post_init__(self) -> None:
        for name in ("num_players", "max_moves", "max_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"rollout.agent_kwargs.{name} must be >= 1, got {getattr(self, name)}")
        if self.temperature < 0:
            raise ValueError(f"rollout.agent_kwargs.temperature must be >= 0, got {self.temperature}")


def textarena_agent(spec: str, kwargs: dict[str, Any] | None = None) -> Callable[..., Awaitable[dict[str, float]]]:
    """The agent run of ``spec`` (module docstring). Checks now (in the zygote, before any fork)
    that the game exists and takes ``num_players``: a ``ValueError`` naming it."""
    game = spec[len(PREFIX) :]
    try:
        config = GameConfig(**(kwargs or {}))
    except TypeError as e:
        raise ValueError(f"rollout.agent={spec!r}: {e}; its agent_kwargs are {[f.name for f in dataclasses.fields(GameConfig)]}") from None
    try:
        import textarena
        from textarena.agents.basic_agents import STANDARD_GAME_PROMPT
        from textarena.envs.registration import ENV_REGISTRY
    except ImportError as e:
        raise ValueError(f"rollout.agent={spec!r}: textarena does not import ({e}): {INSTALL}") from None
    if game not in ENV_REGISTRY:
        near = difflib.get_close_matches(game, list(ENV_REGISTRY), n=5)
        raise ValueError(f"rollout.agent={spec!r}: TextArena has no game {game!r}" + (f"; did you mean {near}?" if near else ""))
    try:
        textarena.make(env_id=game).reset(num_players=config.num_players, seed=0)
    except (AssertionError, ValueError) as e:  # a game states the player counts it takes with an assert
        raise ValueError(
            f"rollout.agent={spec!r}: {game} does not start with num_players={config.num_players} ({e}); "
            "set rollout.agent_kwargs.num_players"
        ) from None

    async def run(data: dict, base_url: str, api_key: str, http_client: Any = None, **_: Any) -> dict[str, float]:
        from openai import AsyncOpenAI

        client = AsyncOpenAI(base_url=base_url, api_key=api_key, http_client=http_client, max_retries=0)
        env = textarena.make(env_id=game)
        env.reset(num_players=config.num_players, seed=_seed(data))
        moves: list[tuple[int, str]] = []  # (player, completion id), in play order
        done = False
        while not done:
            if len(moves) == config.max_moves:
                raise RuntimeError(f"TextArena game {game} did not end within max_moves={config.max_moves} moves")
            player, observation = env.get_observation()
            completion = await client.chat.completions.create(
                model="default",
                messages=[{"role": "system", "content": STANDARD_GAME_PROMPT}, {"role": "user", "content": _text(observation)}],
                max_tokens=config.max_tokens,
                temperature=config.temperature,
            )
            moves.append((player, completion.id))
            done, _info = env.step(action=completion.choices[0].message.content or "")
        rewards = _player_rewards(game, env.close(), config.num_players)
        return {cid: rewards[player] for player, cid in moves}

    return run


def game_rows(game: str, n: int, first_seed: int = 0) -> list[dict[str, Any]]:
    """``n`` dataset rows for a game, one seed each (the game itself is the prompt)."""
    return [{"question": f"{game} #{seed}", "answer": "", "seed": seed} for seed in range(first_seed, first_seed + n)]


def _seed(data: dict) -> int:
    if isinstance(data.get("seed"), int):
        return data["seed"]
    return int.from_bytes(hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).digest()[:4], "little")


def _text(observation: Any) -> str:
    """What TextArena's wrappers render (a string); a raw game's (sender, text, kind) messages joined."""
    if isinstance(observation, str):
        return observation
    return "\n".join(str(m[1]) if isinstance(m, (tuple, list)) and len(m) > 1 else str(m) for m in observation)


def _player_rewards(game: str, closed: Any, num_players: int) -> dict[int, float]:
    """Each player's reward from ``close()`` (``(rewards, game_info)``), checked."""
    rewards = closed[0] if isinstance(closed, tuple) else closed
    if not isinstance(rewards, dict):
        raise RuntimeError(f"TextArena game {game} ended without rewards (close() gave {closed!r:.200})")
    out = {}
    for player in range(num_players):
        value = rewards.get(player)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise RuntimeError(
                f"TextArena game {game} gave player {player} the reward {value!r}, not a finite number (rewards {rewards!r:.200})"
            )
        out[player] = float(value)
    return out
