"""Held-out evaluation and the statistics that say whether the reward really rose.

``resolve_eval_mode`` decides what data.eval_mode scores with (``auto``: the user's agent when the
run trains one, else one reply per question). ``evaluate`` scores the policy the engine serves
now on held-out problems, straight through the engine (chat template -> /generate), once sampled
at the training temperature and once greedy. ``Progress`` prints its console lines while it runs
(and the agent's evaluation's, areal/controller/agent_eval.py), with the time spent and an
estimate of the time left, then one summary line: an evaluation of a real model on many problems
takes minutes. ``reward_trend`` and ``paired_test`` turn "the curve went up" into a number with a
p-value, so a run's summary can say whether the rise is more than noise.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import numpy as np

from areal.embedded.corpus import math_reward
from areal.engine.interface import InferenceEngine


def resolve_eval_mode(mode: str, agent: str, builtin_agent: str, workflow_kind: str) -> tuple[str, str]:
    """What data.eval_mode ``mode`` scores with, and why, for a run whose agent is ``agent``
    (rollout.agent; ``builtin_agent``: its default) given as ``workflow_kind`` ("spec": by
    rollout.agent, "agent": an AgentWorkflow object, "rollout": a RolloutWorkflow object).

    ``auto`` follows the run's agent: a user's agent decides what a good answer is (its reward, or
    the run's reward= when it returns none), so its own episodes are what the evaluation scores;
    the built-in agent is the single-turn task, scored one reply per question. A RolloutWorkflow
    object has no runner to run evaluation episodes: single-turn (refused when asked for by name)."""
    if mode == "agent" and workflow_kind == "rollout":
        raise ValueError(
            "data.eval_mode=agent runs the agent's episodes through the run's runner, and a RolloutWorkflow object has none: "
            "use data.eval_mode=single_turn (or auto), or give the agent as an AgentWorkflow (async run(data, **extra_kwargs))"
        )
    if mode in ("single_turn", "agent"):
        return mode, f"data.eval_mode={mode}"
    if mode != "auto":
        raise ValueError(f"data.eval_mode must be auto, single_turn or agent, got {mode!r}")
    if workflow_kind == "rollout":
        return "single_turn", "data.eval_mode=auto: one reply per question (a RolloutWorkflow object cannot run evaluation episodes)"
    if workflow_kind == "agent" or agent != builtin_agent:
        who = "the agent object given to the run" if workflow_kind == "agent" else f"rollout.agent={agent}"
        return "agent", f"data.eval_mode=auto: the run's own agent ({who}), scored as its training episodes are"
    return "single_turn", "data.eval_mode=auto: one reply per question (the built-in agent's task)"


def eval_label(name: str, version: int) -> str:
    """How the console names the evaluation ``name`` (before, periodic, after) of ``version``."""
    if name == "before":
        return "before training"
    return f"after training (v{version})" if name == "after" else f"{name} (v{version})"


class Progress:
    """An evaluation's console lines: one as it starts (``detail`` says what it runs), then one
    each time another tenth of its ``total`` replies or episodes is done, and between tenths one
    for the first done ``heartbeat_s`` or more after the last line (a slow one shows it moves;
    inside ``beating()`` also when nothing is done). Each says the time spent and, from the pace
    so far, about how long the rest takes; ``finish`` writes the summary line. ``clock``: seconds,
    monotonic (a test's own)."""

    def __init__(
        self,
        what: str,
        total: int,
        unit: str,
        write: Callable[[str], None],
        detail: str = "",
        heartbeat_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what, self.total, self.unit, self.write, self.heartbeat_s, self.clock = what, total, unit, write, heartbeat_s, clock
        self.done = self.tenths = 0
        self.t0 = self.last_line = clock()
        write(f"[eval] {what}: 0/{total} {unit}" + (f" ({detail})" if detail else ""))

    def advance(self) -> None:
        """One more reply or episode done."""
        self.done += 1
        now, tenths = self.clock(), self.done * 10 // max(1, self.total)
        if tenths > self.tenths or now - self.last_line >= self.heartbeat_s:
            self.tenths = tenths
            self._line(now)

    @contextlib.asynccontextmanager
    async def beating(self) -> AsyncIterator[None]:
        """While the body runs, a line whenever ``heartbeat_s`` passed without one, done or not:
        a first reply that takes minutes shows the evaluation is alive, not stuck in silence."""

        async def beat() -> None:
            while True:
                await asyncio.sleep(max(0.01, self.last_line + self.heartbeat_s - self.clock()))
                if self.clock() - self.last_line >= self.heartbeat_s:
                    self._line(self.clock())

        task = asyncio.create_task(beat())
        try:
            yield
        finally:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)

    def _line(self, now: float) -> None:
        self.last_line, spent = now, now - self.t0
        if self.done == 0:
            eta = ", waiting for the first"
        elif self.done < self.total:  # the pace so far: replies are alike, episodes roughly
            eta = f", about {_duration(spent / self.done * (self.total - self.done))} left"
        else:
            eta = ""
        self.write(f"[eval] {self.what}: {self.done}/{self.total} {self.unit}, {_duration(spent)}{eta}")

    def finish(self, result: dict[str, Any], extra: str = "") -> None:
        """The summary line: how long it took, what it cost (``result``'s ``sampled_tokens``) and its scores."""
        self.write(
            f"[eval] {self.what}: done in {_duration(result['wall_s'])} ({self.total} {self.unit}, "
            f"{result.get('sampled_tokens', 0)} tokens sampled): sampled_acc {result['sampled_acc']:.3f}, "
            f"greedy_acc {result['greedy_acc']:.3f} ({result.get('mode', 'single_turn')})" + (f"; {extra}" if extra else "")
        )


def _duration(seconds: float) -> str:
    """``seconds`` as people read a wait: 42 s, 3 min 05 s, 1 h 12 min."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


async def evaluate(
    engine: InferenceEngine,
    tokenizer: Any,
    problems: list[dict],
    temperature: float,
    samples: int = 4,
    max_tokens: int = 64,
    reward_fn: Callable[..., float] | None = None,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Accuracy on ``problems`` (rows with messages/answer): ``samples`` seeded draws at the
    training temperature per problem, plus one greedy answer, each a single reply to the row's
    messages scored by ``reward_fn`` (AReaL's signature; default: the embedded task's answer
    check). Per-problem scores are kept so a later evaluation of the same problems can be
    compared pairwise. ``served_versions``: the numbered weight versions that generated the
    answers (one, unless the trainer published a new version while this ran). What it cost:
    ``wall_s`` and ``sampled_tokens`` (the tokens the engine generated). ``progress`` advances
    once per scored reply (``len(problems) x (samples + 1)`` in all)."""
    t0 = time.monotonic()
    stop = sorted(
        {
            t
            for t in (tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id)
            if isinstance(t, int) and t != tokenizer.unk_token_id
        }
    )

    served: set[str] = set()  # the weight versions that generated the answers
    sampled_tokens = 0

    async def score(problem: dict, temp: float, seed: int) -> float:
        messages = problem.get("messages") or [{"role": "user", "content": problem["question"]}]
        text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        ids = tokenizer.encode(text, add_special_tokens=False)
        params = {"max_new_tokens": max_tokens, "temperature": temp, "stop_token_ids": stop, "sampling_seed": seed}
        nonlocal sampled_tokens
        result = await engine.generate(ids, params, return_logprob=False)
        served.update(result.output_versions or [result.weight_version])
        sampled_tokens += len(result.output_ids)
        completion = tokenizer.decode(result.output_ids, skip_special_tokens=True)
        if reward_fn is None:
            reward = math_reward(completion, problem["answer"])
        else:
            row = {k: v for k, v in problem.items() if k not in ("prompt", "completions", "prompt_ids", "completion_ids")}
            reward = float(await asyncio.to_thread(reward_fn, text, completion, ids, list(result.output_ids), **row))
        if progress is not None:
            progress.advance()
        return reward

    sampled = await asyncio.gather(*(score(p, temperature, i * samples + j) for i, p in enumerate(problems) for j in range(samples)))
    greedy = await asyncio.gather(*(score(p, 0.0, i) for i, p in enumerate(problems)))
    per_problem = [sum(sampled[i * samples : (i + 1) * samples]) / samples for i in range(len(problems))]
    n = len(problems)
    return {
        "n": n,
        "samples": samples,
        "mode": "single_turn",
        "sampled_acc": sum(per_problem) / n,
        "greedy_acc": sum(greedy) / n,
        "per_problem_sampled": per_problem,
        "per_problem_greedy": list(greedy),
        "served_versions": sorted(int(v) for v in served if v.isdigit()),
        "wall_s": round(time.monotonic() - t0, 2),
        "sampled_tokens": sampled_tokens,
    }


def paired_test(before: list[float], after: list[float], seed: int = 0, permutations: int = 10000) -> dict[str, float]:
    """Did per-problem accuracy rise? Mean of (after - before) over the same problems, with a
    one-sided sign-flip permutation p-value (under no effect, each difference is as likely to
    have the opposite sign)."""
    d = np.asarray(after, dtype=np.float64) - np.asarray(before, dtype=np.float64)
    observed = float(d.mean())
    signs = np.random.default_rng(seed).choice((-1.0, 1.0), size=(permutations, len(d)))
    null = (signs * d).mean(axis=1)
    return {"diff": observed, "p_value": float(((null >= observed - 1e-12).sum() + 1) / (permutations + 1)), "n": len(d)}


def reward_trend(step_rewards: list[float], seed: int = 0, permutations: int = 5000) -> dict[str, float]:
    """Did the batch reward rise over the run? Two one-sided permutation tests on the step rewards.

    Trend (the main test; it uses every step): a least-squares line through (step, reward);
    ``fit_start``/``fit_end`` are its values at the first and last step, ``p_value`` is how often
    the same rewards in a random step order give a slope at least as steep. Windows (the plain
    reading): the mean of the last quarter of steps minus the first quarter, ``window_p_value``
    from random splits of those steps. Step rewards are one batch each, so under "no learning"
    their order is exchangeable; difficulty-stratified batches (the controller's
    ``stratified_order``) keep the draw of prompts from moving them.
    """
    n, k = len(step_rewards), max(1, len(step_rewards) // 4)
    if n < 4:
        nan = float("nan")
        return {
            "first_mean": nan,
            "last_mean": nan,
            "diff": nan,
            "window_p_value": nan,
            "window": k,
            "fit_start": nan,
            "fit_end": nan,
            "slope": nan,
            "p_value": nan,
            "steps": n,
        }
    r = np.asarray(step_rewards, dtype=np.float64)
    t = np.arange(n, dtype=np.float64) - (n - 1) / 2  # centred: slope = (t . r) / (t . t)
    slope = float(t @ r / (t @ t))
    rng = np.random.default_rng(seed)
    perms = np.stack([rng.permutation(r) for _ in range(permutations)])  # (P, n)
    null_slopes = perms @ t / (t @ t)
    p_trend = float(((null_slopes >= slope - 1e-12).sum() + 1) / (permutations + 1))
    first, last = r[:k], r[-k:]
    observed = float(last.mean() - first.mean())
    pool = np.concatenate([first, last])
    null_gaps = np.array([(q[k:].mean() - q[:k].mean()) for q in (rng.permutation(pool) for _ in range(permutations))])
    p_window = float(((null_gaps >= observed - 1e-12).sum() + 1) / (permutations + 1))
    mean = float(r.mean())
    return {
        "first_mean": float(first.mean()),
        "last_mean": float(last.mean()),
        "diff": observed,
        "window_p_value": p_window,
        "window": k,
        "fit_start": mean + slope * t[0],
        "fit_end": mean + slope * t[-1],
        "slope": slope,
        "p_value": p_trend,
        "steps": n,
    }
