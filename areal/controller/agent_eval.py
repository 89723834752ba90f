"""Held-out evaluation of the run's own agent (``data.eval_mode=agent``), and the tool-use
statistics of an episode read off the gateway's recorded calls.

    held-out problem ×  data.eval_samples episodes (data.eval_temperature, else the agent's own)
                     +  1 greedy episode (temperature 0)
        │  at most rollout.max_concurrent_episodes at a time, beside the training episodes
        ▼
    Episodes.evaluate: a gateway session at that temperature ─► the run's runner (the
        sandboxed zygote, or inline) ─► rollout.agent(rollout.agent_kwargs) ─► gateway ─► engine;
        the outcome scored as a training episode's is (the agent's reward, or the run's reward=)
        │
        ▼
    score: the episode's reward (a policy failure's is rollout.policy_failure_reward; an agent or
           infrastructure failure scores 0); ``failed_episodes`` counts the episodes not ok
    tool use: episode_tool_use(its interactions)
        ├► the console          a line as it starts, then one per tenth of its episodes done with the time
        │                       spent and left, then a summary line (areal.controller.evaluation.Progress)
        ├► eval_episodes.jsonl  one line per evaluation episode, with its decoded replies
        └► the result: ``areal.controller.evaluation.evaluate``'s keys (sampled_acc, greedy_acc,
           per_problem_sampled, per_problem_greedy, served_versions, wall_s, sampled_tokens),
           "mode": "agent", and the tool-use means of the sampled episodes (``tool_use_means``)

Invariants: evaluation episodes are never trained. The controller opens and closes their sessions
itself, outside the rollout loop: they reach neither the rings nor episodes.jsonl, calls.jsonl,
the step's metric windows or the failure-rate window; their ids start with ``eval``. The result
has the single-turn evaluation's keys, so periodic evaluation (best/), the summary's paired test
(``per_problem_sampled`` of before and after) and the plot read it unchanged. The evaluation
takes no admission slot and waits for nothing the rollout loop holds (its bound is its own
semaphore; the runners put no cap on the episodes in flight), so it cannot deadlock with
admission while it runs beside the training episodes.

Tool use of one episode, from its ``Interaction``s (the same for every agent):
  ``calls``                 LLM calls
  ``tool_calls``            well-formed tool calls the gateway parsed (what the agent received)
  ``malformed_tool_calls``  call markup the gateway's parser could not read (``ParsedOutput.malformed``)
  ``used_tool_result``      1 when the final reply's content contains the content of a ``tool``
                            message of its history (``areal.gateway.generation.used_tool_result``)

What is covered: sandboxed (subproc) and inline agents, an agent object, the zygote dying during an
evaluation (the episode runs again once it is restarted; on Ray rollout workers, once its runner
dropped the lost worker). What is not covered: a RolloutWorkflow
object (it has no runner; refused when the run starts); seeded draws (the agent's requests carry
no seed), so before and after are paired by problem, not by random draw; a resumed run appends
to eval_episodes.jsonl, its evaluations numbered from 1 again (``eval<k>-`` ids).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from areal.agent.failures import POLICY
from areal.controller.evaluation import Progress, eval_label
from areal.gateway.tree import Interaction
from areal.jsonl import json_line
from areal.protocol import EpisodeOutcome

TOOL_USE = ("calls", "tool_calls", "malformed_tool_calls", "used_tool_result")


class EvalEpisode(NamedTuple):
    outcome: EpisodeOutcome  # scored and classified as a training episode's
    interactions: list[Interaction]  # its gateway session's, in call order


# (episode id, problem row, temperature or None: the agent's own) -> the episode
RunEpisode = Callable[[str, dict, float | None], Awaitable[EvalEpisode]]


def episode_tool_use(interactions: Sequence[Interaction]) -> dict[str, float]:
    """One episode's tool use (the keys of ``TOOL_USE``); ``interactions`` in call order."""
    return {
        "calls": float(len(interactions)),
        "tool_calls": float(sum(i.tool_calls for i in interactions)),
        "malformed_tool_calls": float(sum(i.malformed_tool_calls for i in interactions)),
        "used_tool_result": float(bool(interactions) and interactions[-1].used_tool_result),
    }


def tool_use_means(episodes: Sequence[dict[str, float]]) -> dict[str, float]:
    """Per-episode means of ``episode_tool_use`` rows, as the run reports them."""
    n = max(1, len(episodes))
    mean = lambda key: sum(e[key] for e in episodes) / n  # noqa: E731
    return {
        "calls_per_episode": mean("calls"),
        "tool_calls_per_episode": mean("tool_calls"),
        "malformed_tool_calls_per_episode": mean("malformed_tool_calls"),
        "used_tool_result_share": mean("used_tool_result"),
    }


def episode_score(outcome: EpisodeOutcome, interactions: Sequence[Interaction]) -> float:
    """The reward an evaluation counts: the episode's own (its float, else its per-completion
    rewards summed, else those set through the gateway summed); 0 for an agent or infrastructure
    failure, which has none."""
    if outcome.status != "ok" and outcome.failure_class != POLICY:
        return 0.0
    if outcome.reward is not None:
        return float(outcome.reward)
    if outcome.rewards_by_id:
        return float(sum(outcome.rewards_by_id.values()))
    return float(sum(i.reward for i in interactions if i.reward is not None))


class AgentEvaluation:
    """``await evaluation(name)``: the run's agent on the held-out ``problems``; ``name`` (before,
    periodic, after) labels its episodes in ``log_path``. ``version()``: the policy version served
    when it starts (a label; ``served_versions`` says what actually generated)."""

    def __init__(
        self,
        run_episode: RunEpisode,
        problems: list[dict],
        samples: int,
        temperature: float | None,
        concurrency: int,
        log_path: Path,
        decode: Callable[[list[int]], str],
        version: Callable[[], int],
        log: Callable[[str], None],
    ) -> None:
        self.run_episode, self.problems, self.samples, self.temperature = run_episode, problems, samples, temperature
        self.concurrency, self.log_path, self.decode, self.version, self.log = concurrency, log_path, decode, version, log
        self.count = 0  # evaluations started: keeps episode ids unique across a run's evaluations

    async def __call__(self, name: str) -> dict[str, Any]:
        self.count += 1
        version, t0 = self.version(), time.monotonic()
        gate = asyncio.Semaphore(self.concurrency)
        lines: list[str] = []
        n, k = len(self.problems), self.samples
        detail = f"the run's agent: {n} problems x {k} sampled + 1 greedy episodes"
        progress = Progress(eval_label(name, version), n * (k + 1), "episodes", self.log, detail)

        async def one(i: int, sample: int | None) -> tuple[float, dict[str, float], EvalEpisode]:
            temperature = 0.0 if sample is None else self.temperature
            episode_id = f"eval{self.count}-{name}-v{version}-p{i}-" + ("greedy" if sample is None else f"s{sample}")
            async with gate:
                ep = await self.run_episode(episode_id, self.problems[i], temperature)
            score, use = episode_score(ep.outcome, ep.interactions), episode_tool_use(ep.interactions)
            lines.append(self._line(name, version, i, sample, ep, score, use))
            progress.advance()
            return score, use, ep

        async with progress.beating():
            episodes = await asyncio.gather(*(one(i, j) for i in range(n) for j in range(k)), *(one(i, None) for i in range(n)))
        sampled, greedy = episodes[: n * k], episodes[n * k :]
        with open(self.log_path, "a") as f:  # whole evaluations only: a cancelled one writes nothing
            f.writelines(lines)
        per_problem = [sum(s for s, _, _ in sampled[i * k : (i + 1) * k]) / k for i in range(n)]
        served = {v for _, _, ep in (*sampled, *greedy) for x in ep.interactions for v in (x.output_versions or [x.version])}
        result = {
            "n": n,
            "samples": k,
            "mode": "agent",
            "sampled_acc": sum(per_problem) / n,
            "greedy_acc": sum(s for s, _, _ in greedy) / n,
            "per_problem_sampled": per_problem,
            "per_problem_greedy": [s for s, _, _ in greedy],
            "served_versions": sorted(served),
            **tool_use_means([u for _, u, _ in sampled]),
            "failed_episodes": sum(ep.outcome.status != "ok" for _, _, ep in (*sampled, *greedy)),
            "wall_s": round(time.monotonic() - t0, 2),
            "sampled_tokens": sum(len(x.output_ids) for _, _, ep in (*sampled, *greedy) for x in ep.interactions),
        }
        progress.finish(
            result,
            f"per episode {result['calls_per_episode']:.2f} calls, {result['tool_calls_per_episode']:.2f} tool calls, "
            f"{result['malformed_tool_calls_per_episode']:.2f} malformed; answers using a tool result "
            f"{result['used_tool_result_share']:.2f}; {result['failed_episodes']} failed",
        )
        return result

    def _line(self, name: str, version: int, problem: int, sample: int | None, ep: EvalEpisode, score: float, use: dict[str, float]) -> str:
        o = ep.outcome
        return json_line(
            {
                "eval": name,
                "version": version,
                "episode_id": o.episode_id,
                "problem": problem,
                "sample": "greedy" if sample is None else sample,
                "status": o.status,
                "failure_class": o.failure_class,
                "score": score,
                **{key: int(v) for key, v in use.items()},
                "replies": [self.decode(x.output_ids) for x in ep.interactions],
                "error": o.error[-2000:],
            }
        )
