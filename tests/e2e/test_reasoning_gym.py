"""A run on a weighted mix of three reasoning-gym tasks, from one setting, scored by the tasks' own
scorers: ``data.train=reasoning-gym:chain_sum@2/max_terms:3+leg_counting+fraction_simplification``
with the one-call agent (agents/reasoning_gym_agent.py, sandboxed: the default), which returns no
reward, and ``reward=`` empty.

The scripted model answers every prompt with the same line and no <answer> tag, so the scorers
give chain_sum and leg_counting 0.0 and fraction_simplification its own format score, 0.01: a
value no hand-written check would give, so the rewards show which function scored them. Checked
against reasoning_gym called here, on the replies the run recorded: the prompts are the generators'
questions under reasoning-gym's system prompt; every training and held-out episode's reward is its
task's scorer on that reply; metrics.jsonl has reward/<task> per step (the mean over that step's
episodes of the task), evals.jsonl and summary.json the held-out accuracy per task; the held-out
questions are none of the train ones; the viewer lists and plots a curve per task. Nothing is timed.
"""

from __future__ import annotations

import json
import statistics

import pytest
import reasoning_gym
from browser import browser_or_skip
from paths import ROOT
from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer
from run_checks import read_jsonl, run_ok, train_cmd
from transformers import AutoTokenizer

from areal.dataset import load_rows
from areal.utils.hf_utils import resolve_model_path
from areal.view.data import RunView
from areal.view.server import write_html

pytestmark = pytest.mark.e2e  # a whole run

MIX = "reasoning-gym:chain_sum@2/max_terms:3+leg_counting+fraction_simplification"
TASKS = ("chain_sum", "fraction_simplification", "leg_counting")
SEED, TRAIN_SIZE, EVAL_SIZE = 7, 16, 6


def _scored(row: dict, reply: str) -> float:
    """What reasoning-gym itself says of ``reply`` to ``row``: its task's scorer (built with the
    row's config overrides) on the last <answer> tag."""
    dataset = reasoning_gym.create_dataset(row["task"], **row["task_config"])
    return dataset.score_answer(extract_answer(reply), {k: row[k] for k in ("question", "answer", "metadata")})


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("rg") / "run"
    run_ok(
        train_cmd(
            run_dir,
            "model.path=scripted",
            "rollout.agent=agents/reasoning_gym_agent.py:ReasoningGymAgent",
            "+rollout.agent_kwargs.max_tokens=48",
            f"data.train={MIX}",
            f"data.train_size={TRAIN_SIZE}",
            f"data.eval_size={EVAL_SIZE}",
            "data.eval_samples=1",
            f"seed={SEED}",
            "trainer.steps=2",
            "rollout.groups_per_step=4",  # weights 2:1:1: every step two chain_sum groups, one of each other task
            "rollout.n_samples=2",
            "rollout.max_head_offpolicyness=0",  # a step's metrics row covers exactly its own episodes
        ),
        timeout_s=600,
    )
    return run_dir


def test_rows_come_from_the_generators_and_episodes_are_scored_by_the_tasks_scorers(run_dir):
    rows = load_rows(MIX, "train", size=TRAIN_SIZE, seed=SEED)
    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path("scripted"))
    calls = {c["episode_id"]: c["calls"] for c in read_jsonl(run_dir / "calls.jsonl")}
    episodes = read_jsonl(run_dir / "episodes.jsonl")
    assert len(episodes) == 2 * 4 * 2 and all(e["status"] == "ok" for e in episodes), episodes
    by_step: dict[tuple[int, str], list[float]] = {}
    for e in episodes:
        row = rows[int(e["group_id"].rpartition("-p")[2])]  # the group's prompt: g<n>-p<index of the row>
        (call,) = calls[e["episode_id"]]
        prompt = tokenizer.decode(call["prompt_ids"])
        assert row["question"] in prompt and SYSTEM_PROMPTS["default"].splitlines()[0] in prompt  # reasoning-gym's convention
        reply = tokenizer.decode(call["output_ids"], skip_special_tokens=True)  # as the run decodes it for the reward
        assert e["reward"] == _scored(row, reply), (row["task"], reply)
        by_step.setdefault((e["versions"][0] + 1, row["task"]), []).append(e["reward"])
    assert {r for (_, task), rs in by_step.items() for r in rs if task == "fraction_simplification"} == {0.01}  # its format score
    assert {r for (_, task), rs in by_step.items() for r in rs if task != "fraction_simplification"} == {0.0}

    metrics = read_jsonl(run_dir / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    for m in metrics:
        assert {k for k in m if k.startswith("reward/")} == {f"reward/{t}" for t in TASKS}
        for t in TASKS:
            assert m[f"reward/{t}"] == pytest.approx(statistics.mean(by_step[(m["step"], t)])), (m["step"], t)
            assert m[f"episodes/{t}"] == len(by_step[(m["step"], t)])
        assert m["episodes/chain_sum"] == 4 and m["episodes/leg_counting"] == 2  # the weights, every step


def test_held_out_problems_are_disjoint_from_train_and_scored_per_task(run_dir):
    train = load_rows(MIX, "train", size=TRAIN_SIZE, seed=SEED)
    held_out = load_rows(MIX, "test", size=EVAL_SIZE, seed=SEED)
    assert {r["question"] for r in held_out}.isdisjoint({r["question"] for r in train})
    counts = {t: sum(r["task"] == t for r in held_out) for t in TASKS}
    assert counts == {"chain_sum": 3, "fraction_simplification": 1, "leg_counting": 2}  # weights 2:1:1 of 6, exactly
    for e in read_jsonl(run_dir / "eval_episodes.jsonl"):  # the run's agent on the held-out rows, never trained
        reply = "".join(e["replies"]).replace("<|im_end|>", "")
        assert e["score"] == _scored(held_out[e["problem"]], reply), e
    summary = json.loads((run_dir / "summary.json").read_text())
    evals = {e["name"]: e for e in read_jsonl(run_dir / "evals.jsonl")}
    assert set(evals) == {"before", "after"}
    for result in (evals["before"], evals["after"], summary["eval_before"], summary["eval_after"]):
        assert {k for k in result if k.startswith("n/")} == {f"n/{t}" for t in counts}
        for t, n in counts.items():
            expected = 0.01 if t == "fraction_simplification" else 0.0
            assert result[f"n/{t}"] == n and result[f"sampled_acc/{t}"] == pytest.approx(expected), (t, result)
            assert result[f"greedy_acc/{t}"] == pytest.approx(expected)


def test_the_viewer_lists_and_plots_the_reward_of_each_task(run_dir, tmp_path):
    view = RunView(run_dir)
    assert all(f"reward/{t}" in step for step in view.steps() for t in TASKS)
    page = tmp_path / "view.html"
    write_html(view, page)
    chromium = browser_or_skip()
    from playwright.sync_api import sync_playwright

    shots = ROOT / "test-artifacts" / "view"
    shots.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        tab = browser.new_page(viewport={"width": 1400, "height": 900})
        errors: list[str] = []
        tab.on("pageerror", lambda e: errors.append(str(e)))
        tab.goto(page.as_uri())
        tab.wait_for_selector("body[data-ready='1']", state="attached", timeout=30_000)
        assert tab.locator("#steps th.task").all_inner_texts() == list(TASKS)
        assert tab.locator("#steps tr.step td[data-task='fraction_simplification']").all_inner_texts() == ["0.010", "0.010"]
        curves = tab.locator("#reward-chart polyline.curve").evaluate_all("lines => lines.map(l => l.dataset.key)")
        assert curves == ["reward_mean", *(f"reward/{t}" for t in TASKS)]
        assert "fraction_simplification 0.010 → 0.010" in tab.inner_text("#task-accuracy")  # held-out, before → after
        tab.screenshot(path=str(shots / "reasoning-gym-tasks.png"))
        browser.close()
    assert errors == []
