"""TextArena games as the agent (areal/agent/textarena_env.py): ``rollout.agent=textarena:GAME`` in
real sandboxed episodes (the game's state in the episode's process) against a real gateway on the
scripted model, and inline for games registered here.

Whatever the model writes, a game ends (by its rules, its turn limit or its invalid-move limit):
asserted are the calls (one per move, each recorded), the rewards (each call gets the final reward
of the player whose move it made, within the game's range) and errors naming the game. Besides
TextArena's own games, games registered by tests/support/textarena_games.py (the zygote preloads it)
give every move a known owner and a known end.
"""

from __future__ import annotations

import asyncio
import sys

import pytest
from textarena_games import SEAT_PROMPT
from transformers import AutoTokenizer
from zygote_harness import sandboxed_episodes

from areal.agent.spec import InlineRunner, load_agent
from areal.agent.textarena_env import game_rows
from areal.embedded import ensure_scripted_model
from sandbox.isolation import SandboxConfig

DEADLINE_S = 120.0


@pytest.fixture(scope="module")
def tokenizer():
    return AutoTokenizer.from_pretrained(ensure_scripted_model())


def _episodes(gw, spec: str, rows: list[dict], kwargs: dict | None = None) -> list[tuple]:
    """Each row as one sandboxed episode of ``spec``: [(outcome, the gateway's interactions)]."""
    config = SandboxConfig(warm_slots=1, preload=["openai", "anthropic", "textarena_games"])  # the games registered here
    return sandboxed_episodes(gw, spec, rows, kwargs, config, DEADLINE_S)


def test_a_single_player_game_rewards_every_move_it_played(served_scripted, tokenizer):
    rows = game_rows("GuessTheNumber-v0", 2, first_seed=7)
    for outcome, calls in _episodes(served_scripted, "textarena:GuessTheNumber-v0", rows):
        assert outcome.status == "ok", (outcome.error, outcome.log_tail)
        # one call per move until the game ended: at most its 10 guesses, plus one invalid move forgiven
        assert 1 <= len(calls) <= 11 and set(outcome.rewards_by_id) == {c.id for c in calls}
        (reward,) = set(outcome.rewards_by_id.values())  # one player: every move shares its end
        assert 0.0 <= reward <= 1.0
        assert all("You are playing Guess The Number" in tokenizer.decode(c.prompt_ids) for c in calls)


def test_self_play_gives_each_players_moves_that_players_reward(served_scripted, tokenizer):
    rows = game_rows("TicTacToe-v0", 2)
    for outcome, calls in _episodes(served_scripted, "textarena:TicTacToe-v0", rows, {"num_players": 2}):
        assert outcome.status == "ok", (outcome.error, outcome.log_tail)
        assert set(outcome.rewards_by_id) == {c.id for c in calls}
        player = {c.id: next(p for p in (0, 1) if f"You are Player {p} in Tic Tac Toe" in tokenizer.decode(c.prompt_ids)) for c in calls}
        assert player[calls[0].id] == 0
        rewards = {p: {outcome.rewards_by_id[c] for c in player if player[c] == p} for p in (0, 1)}
        assert all(len(r) <= 1 for r in rewards.values())  # a player's moves share the player's reward
        final = {p: r.pop() for p, r in rewards.items() if r}  # a player who never moved has no calls
        assert set(final.values()) <= {-1.0, 0.0, 1.0}
        if len(final) == 2:
            assert final[0] == -final[1]  # zero-sum: a win and a loss, or a draw


def test_games_and_settings_textarena_does_not_have_fail_at_load_naming_them():
    with pytest.raises(ValueError, match=r"TextArena has no game 'TicTacTo-v0'; did you mean \[.*'TicTacToe-v0'"):
        load_agent("textarena:TicTacTo-v0")
    with pytest.raises(ValueError, match=r"TicTacToe-v0 does not start with num_players=1 .*rollout.agent_kwargs.num_players"):
        load_agent("textarena:TicTacToe-v0")
    with pytest.raises(ValueError, match=r"'textarena:Nim-v0'.*'players'.*num_players"):
        load_agent("textarena:Nim-v0", {"players": 2})


def test_without_textarena_the_error_names_the_game_and_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "textarena" or m.startswith("textarena.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "textarena", None)  # import textarena raises ImportError
    with pytest.raises(ValueError, match=r"'textarena:TicTacToe-v0': textarena does not import .*: pip install 'areal-lite\[envs\]'"):
        load_agent("textarena:TicTacToe-v0")


def test_self_play_rewards_reach_each_players_calls_sandboxed_and_inline(served_scripted, tokenizer):
    """A registered game where every move counts (tests/support/textarena_games.py): player 0 wins
    after four moves, so player 0's two calls get 1 and player 1's two calls get -1."""
    spec, kwargs = "textarena:AreaLTestAlternate-v0", {"num_players": 2}
    (sandboxed,) = _episodes(served_scripted, spec, game_rows("AreaLTestAlternate-v0", 1), kwargs)
    for outcome, calls in [sandboxed, _inline(served_scripted, spec, kwargs)]:
        assert outcome.status == "ok", (outcome.error, outcome.log_tail)
        player = {c.id: next(p for p in (0, 1) if SEAT_PROMPT.format(player=p) in tokenizer.decode(c.prompt_ids)) for c in calls}
        assert [player[c.id] for c in calls] == [0, 1, 0, 1]
        assert outcome.rewards_by_id == {c.id: (1.0 if player[c.id] == 0 else -1.0) for c in calls}


def test_a_game_that_does_not_end_or_scores_nan_fails_naming_it(served_scripted):
    ((outcome, calls),) = _episodes(served_scripted, "textarena:AreaLTestEndless-v0", game_rows("x", 1), {"max_moves": 3})
    assert outcome.status == "error" and "AreaLTestEndless-v0 did not end within max_moves=3 moves" in outcome.error, outcome.error
    assert len(calls) == 3
    ((outcome, calls),) = _episodes(served_scripted, "textarena:AreaLTestNanReward-v0", game_rows("x", 1))
    assert outcome.status == "error" and "AreaLTestNanReward-v0 gave player 0 the reward nan, not a finite number" in outcome.error
    assert len(calls) == 1


def _inline(gw, spec: str, kwargs: dict) -> tuple:
    """One episode in this process (``rollout.openai.mode=inline``), against the same gateway."""

    async def episode() -> tuple:
        runner = InlineRunner(spec, gw.http, kwargs)
        try:
            key = gw.gateway.open_session("ta-inline")
            return await runner.run_episode("ta-inline", game_rows("x", 1)[0], key, DEADLINE_S), key
        finally:
            await runner.close()

    outcome, key = asyncio.run(episode())
    return outcome, gw.interactions(key)
