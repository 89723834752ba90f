"""The TRL comparison's plumbing (``benchmarks/trl_grpo.py``), without training: the scores that
cross the pipe between the TRL worker and this process, and the SmolLM2 variant's spec against
what our run draws, sends and scores."""

from __future__ import annotations

import importlib.util
import os
import threading
from pathlib import Path

import pytest


def _worker_module():
    from benchmarks.trl_grpo import WORKER

    spec = importlib.util.spec_from_file_location("trl_grpo_worker_under_test", WORKER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_scores_cross_the_pipe_and_a_failing_reward_is_answered():
    """The worker's ``pipe`` scorer gets the parent's reward of each (row, text), in order; a reward
    that raises comes back as the worker's error, not a hang."""
    from benchmarks.trl_grpo import serve_scores

    rows = {"train": [{"answer": "3"}, {"answer": "5"}], "eval": [{"answer": "7"}]}

    def reward(prompt, completion, prompt_ids, completion_ids, *, answer):
        if completion == "boom":
            raise ValueError("unparseable")
        return float(completion == answer)

    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    failed: list[str] = []
    server = threading.Thread(target=serve_scores, args=(os.fdopen(req_r), os.fdopen(rep_w, "w"), rows, reward, failed), daemon=True)
    server.start()
    score = _worker_module().make_scorer("pipe", [str(rep_r), str(req_w)])
    train = [{"index": 1}, {"index": 0}, {"index": 1}]
    assert score("train", train, ["5", "5", "4"]) == [1.0, 0.0, 0.0]
    assert score("eval", [{"index": 0}], ["7"]) == [1.0]
    with pytest.raises(RuntimeError, match="unparseable"):
        score("eval", [{"index": 0}], ["boom"])
    assert failed and "unparseable" in failed[0]
    os.close(req_w)  # the worker's exit: the server sees the end of its requests and stops
    server.join(timeout=10)
    assert not server.is_alive()


def test_smollm2_spec_is_what_our_run_draws_sends_and_scores(tmp_path):
    """The SmolLM2 variant gives TRL the prompts our loop draws, in its order, as the messages the
    agent sends (conf/smollm2.yaml's system prompt and worked example before the question), the
    conf's budget and settings, and our run's reward for them; held-out rows are never train rows."""
    pytest.importorskip("reasoning_gym")
    from areal.agent.spec import load_agent
    from areal.controller.problems import train_problems, user_rows
    from areal.dataset import stratified_order
    from benchmarks.trl_grpo import SMOLLM2, our_overrides, resolved_config, trl_spec

    config = resolved_config(SMOLLM2, our_overrides(SMOLLM2, 3, 5, 2))
    spec, rows, order, reward = trl_spec(SMOLLM2, config, Path("/model"), 3, 1, tmp_path)
    assert reward == "areal.reward.reasoning_gym:reasoning_gym_reward" and spec["reward"] == "pipe"
    assert (spec["n_samples"], spec["groups_per_step"], spec["max_tokens"], spec["lr"], spec["micro_batch"]) == (8, 2, 48, 2e-5, 16)
    assert config.trainer.checkpoint_every == 0 and config.data.eval_size == 5
    assert config.rollout.dynamic_sampling is False  # GRPOTrainer keeps every group: the conf's DAPO filter is off on both sides
    dapo = resolved_config(SMOLLM2, [*our_overrides(SMOLLM2, 3, 5, 2), "rollout.dynamic_sampling=true"])
    with pytest.raises(ValueError, match="rollout.dynamic_sampling"):
        trl_spec(SMOLLM2, dapo, Path("/model"), 3, 1, tmp_path)

    train, levels = train_problems(*user_rows(config.data, None, None, config.seed)[:1], config.data.train_size, config.seed)
    assert order == stratified_order(levels, 2, config.seed)[:6]
    agent = load_agent(config.rollout.agent, config.rollout.agent_kwargs).__self__
    assert [p["prompt"] for p in spec["train"]] == [agent.messages(train[i]) for i in order]
    first = spec["train"][0]["prompt"]
    assert [m["role"] for m in first] == ["system", "user", "assistant", "user"] and "<answer>" in first[2]["content"]
    assert first[-1]["content"] == train[order[0]]["question"]
    assert [r["question"] for r in rows["train"]] == [train[i]["question"] for i in order]
    assert len(spec["eval"]) == len(rows["eval"]) == 5
    assert not {r["question"] for r in rows["eval"]} & {r["question"] for r in train}
