"""The run viewer (``python -m areal.view``) on a real run, and in a real browser.

One short run (``model.path=scripted``, inline agents, 3 steps of one group of 3 episodes on
a one-problem dataset, so every step samples the same prompt) with an agent that makes each kind
of episode the viewer must show, in turn:
- tool: the calculator round trip (a tool call, its result, an answer), one float reward;
- fork: the round trip answered twice (a fork: two children of the first call), then the
  question asked again after a made-up answer (drift: a new root), rewards per call
  ({first answer: 1, drifted call: 0.5});
- fail: one call, then the agent raises (an agent failure with its reason).

Checks without a browser: what the run recorded for the viewer (calls.jsonl, vocab.json) gives
exactly the tokens, loss mask, logprobs and versions the trainer received (trajectories.bin);
the tree, its marks, rewards and discounted returns; the budget of calls.jsonl; the static export.
In the browser (headless Chromium from the system's packages, driven by Playwright; no browser
download): the steps, the filters by status, failure class and reward, an episode's tree with its
token spans, the failure reason, the colour modes, early and late side by side, and the static
page opened from a file. Screenshots go to test-artifacts/view/ (git-ignored).

Without chromium or the playwright package the browser tests skip, saying which is missing;
with AREAL_REQUIRE_BROWSER=1 (CI) they fail instead.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from browser import chromium_browser, open_page, view_server
from paths import ROOT
from run_checks import agent_cmd, run_in_repo

from areal.controller.records import RunRecords
from areal.controller.trackers import TrackerConfig, open_trackers
from areal.controller.trajectories import read_saved_trajectories
from areal.gateway.tree import Interaction
from areal.view.data import RunView
from areal.view.server import write_html

ARTIFACTS = ROOT / "test-artifacts" / "view"

AGENT = """
import itertools

from openai import AsyncOpenAI

from areal.embedded.corpus import CALCULATOR_TOOL, TOOL_SYSTEM_PROMPT
from areal.reward.gsm8k import gsm8k_reward_fn
from areal.workflow.common import execute_tool_call, gateway_kwargs

ROLES = ("tool", "fork", "fail")
turn = itertools.count()


async def run(data, **extra_kwargs):
    role = ROLES[next(turn) % len(ROLES)]
    client = AsyncOpenAI(**gateway_kwargs(extra_kwargs), max_retries=0)
    messages = [{"role": "system", "content": TOOL_SYSTEM_PROMPT}, {"role": "user", "content": data["question"]}]

    async def ask(history):
        return await client.chat.completions.create(model="m", messages=history, tools=[CALCULATOR_TOOL], max_tokens=48)

    first = (await ask(messages)).choices[0].message
    if role == "fail":
        raise RuntimeError("the agent's own bug: lost the calculator's result")
    if not first.tool_calls:
        return gsm8k_reward_fn(completions=first.content or "", answer=data["answer"])
    messages.append(first.model_dump(exclude_none=True))
    for call in first.tool_calls:
        messages.append({"role": "tool", "tool_call_id": call.id, "content": execute_tool_call(call.function.name, call.function.arguments)})
    answer = await ask(messages)
    if role == "tool":
        return gsm8k_reward_fn(completions=answer.choices[0].message.content or "", answer=data["answer"])
    await ask(messages)  # the same history again: a second child of the first call
    rewritten = messages[:2] + [{"role": "assistant", "content": "It is 5."}, {"role": "user", "content": "Check again."}]
    drifted = await ask(rewritten)
    return {answer.id: 1.0, drifted.id: 0.5}
"""


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("view")
    run_dir, cmd = agent_cmd(
        tmp,
        "view_agent.py",
        AGENT,
        "rollout.openai.mode=inline",
        "trainer.steps=3",
        "rollout.groups_per_step=1",
        "rollout.n_samples=3",
        "rollout.max_head_offpolicyness=0",
        "data.eval_size=0",
        "data.train_size=1",
        "save_trajectories=true",
    )
    proc = run_in_repo(cmd, timeout_s=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return run_dir


def _kinds(view: RunView) -> dict[str, list[str]]:
    """Episode ids by kind, told by what each did (not by its position)."""
    kinds: dict[str, list[str]] = {"tool": [], "fork": [], "fail": []}
    for e in view.episodes():
        kind = "fail" if e["status"] == "error" else "fork" if e["drift"] else "tool"
        kinds[kind].append(e["episode_id"])
    return kinds


# ---- without a browser ---------------------------------------------------------------------


@pytest.mark.e2e
def test_the_recorded_calls_are_the_trained_tokens(run_dir):
    """Each trained row, rebuilt from calls.jsonl (a call's prompt = its ancestors' prompt and
    output + the tokens it added), is the row the trainer got: ids, mask, logprobs, versions."""
    assert json.loads((run_dir / "config.json").read_text())["view_record_mb"] > 0  # recorded by default
    calls = {json.loads(line)["episode_id"]: json.loads(line)["calls"] for line in (run_dir / "calls.jsonl").read_text().splitlines()}
    saved = read_saved_trajectories(run_dir / "trajectories.bin")
    assert saved and {t.episode_id for t in saved} <= set(calls)
    for traj in saved:
        by_id = {c["id"]: c for c in calls[traj.episode_id]}
        for call_id, row in zip(traj.interaction_ids, traj.rows()):
            chain = [by_id[call_id]]
            while chain[-1]["parent"] is not None:
                chain.append(by_id[chain[-1]["parent"]])
            ids, mask, logprobs, versions = [], [], [], []
            for c in reversed(chain):
                ids += c["prompt_ids"]
                mask += [0] * len(c["prompt_ids"])
                logprobs += [0.0] * len(c["prompt_ids"])
                versions += [-1] * len(c["prompt_ids"])
                if c is not chain[0]:  # an ancestor's output is prompt to this call
                    ids += c["output_ids"]
                    mask += [0] * len(c["output_ids"])
                    logprobs += [0.0] * len(c["output_ids"])
                    versions += [-1] * len(c["output_ids"])
            ids += chain[0]["output_ids"]
            mask += [1] * len(chain[0]["output_ids"])
            logprobs += chain[0]["logprobs"]
            versions += chain[0]["versions"]
            assert row.input_ids.tolist() == ids
            assert row.loss_mask.tolist() == mask
            assert row.logprobs.tolist() == pytest.approx(logprobs, abs=1e-4)  # 4 decimals recorded
            assert row.versions.tolist() == versions
            assert row.reward == pytest.approx(chain[0]["trained"])


@pytest.mark.e2e
def test_the_tree_its_marks_rewards_returns_and_failures(run_dir):
    view = RunView(run_dir)
    kinds = _kinds(view)
    assert [len(v) for v in kinds.values()] == [3, 3, 3], kinds
    assert [s["step"] for s in view.steps()] == [1, 2, 3]

    tool = view.episode(kinds["tool"][0])
    assert [n["parent"] for n in tool["nodes"]] == [None, tool["nodes"][0]["id"]]
    first, second = tool["nodes"]
    assert first["output"]["tool_calls"] == [{"name": "calculator", "arguments": {"expression": "6*7"}}]
    assert [m["role"] for m in first["messages"]] == ["system", "user"]
    assert second["messages"][0]["tool_results"] == ["42"]  # the calculator's value, in the next prompt
    assert all(t[2] == 0 for t in first["output_tokens"])  # version 0 sampled the first step's episodes
    # One float for the episode: it rewards the last call; γ = 1, so the first call's return is it too.
    reward = view.records[kinds["tool"][0]]["reward"]
    assert (first["reward"], second["reward"], first["return"], second["return"]) == (None, reward, reward, reward)

    fork = view.episode(kinds["fork"][0])
    root, answer, again, drifted = fork["nodes"]
    assert root["fork"] and root["children"] == [answer["id"], again["id"]] and not root["drift"]
    assert drifted["drift"] and drifted["parent"] is None and fork["record"]["drift"] == 1
    assert (answer["reward"], again["reward"], drifted["reward"]) == (1.0, None, 0.5)
    assert root["return"] == pytest.approx(0.5)  # 0 + mean(1, 0)
    assert [m["content"] for m in drifted["messages"]][-2:] == ["It is 5.", "Check again."]

    fail = view.episode(kinds["fail"][0])
    assert fail["failure"]["failure_class"] == "agent" and fail["failure"]["failure_cause"] == "builtins.RuntimeError"
    assert "lost the calculator's result" in fail["nodes"][-1]["failure"]["error"]

    # The one prompt, early and late: the earliest episode of version 0 and the latest of version 2.
    compared = view.compare(kinds["tool"][1])
    assert compared["count"] == 9
    assert view.records[compared["early"]]["versions"] == [0] and view.records[compared["late"]]["versions"] == [2]
    with pytest.raises(KeyError):
        view.episode("no-such-episode")


def test_calls_are_recorded_within_their_budget_spread_over_the_steps(tmp_path):
    """view_record_mb=1 over 4 steps: 256 KiB more becomes usable at each step; an episode over
    the allowance is listed with calls_recorded false."""
    tracker = open_trackers(["jsonl"], TrackerConfig(), tmp_path, "view", {}, 1)
    records = RunRecords(tmp_path, tracker, save_trajectories=False, view_record_mb=1, steps=4)
    big = [
        Interaction(
            id="c",
            prompt_ids=[1] * 8_000,
            output_ids=[2] * 8_000,
            output_logprobs=[-0.5] * 8_000,
            version=0,
            finish_reason="stop",
            created=0.0,
        )
    ]
    recorded = []
    for step in range(4):
        for i in range(4):
            record = {"episode_id": f"s{step}-e{i}"}
            records.episode(record, dict, big)
            recorded.append(record["calls_recorded"])
        records.step({"step": step + 1, "reward_mean": 0.0})
    records.close(True)
    per_line = len((tmp_path / "calls.jsonl").read_text().splitlines()[0]) + 1
    assert 256 << 10 > 2 * per_line > 160 << 10  # each step's share holds two of these lines
    assert recorded == [True, True, False, False] * 4
    assert (tmp_path / "calls.jsonl").stat().st_size <= 1 << 20


@pytest.mark.e2e
def test_a_killed_runs_cut_calls_file_shows_every_complete_line(run_dir, tmp_path):
    cut = tmp_path / "run"
    shutil.copytree(run_dir, cut, ignore=shutil.ignore_patterns("final", "weights"))
    calls = (cut / "calls.jsonl").read_bytes()
    (cut / "calls.jsonl").write_bytes(calls[:-100])  # the last line cut mid-way
    view = RunView(cut)
    assert sum(e["tree"] for e in view.episodes()) == 8 and len(view.episodes()) == 9
    last = json.loads(calls.splitlines()[-1])["episode_id"]
    assert not view.episode(last)["recorded"] and view.episode(last)["nodes"] == []


@pytest.mark.e2e
def test_the_static_page_holds_the_whole_run_and_loads_nothing(run_dir, tmp_path):
    out = tmp_path / "view.html"
    subprocess.run([sys.executable, "-m", "areal.view", str(run_dir), "--html", str(out)], cwd=ROOT, check=True, timeout=120)
    html = out.read_text()
    assert "window.RUN_DATA" in html and "lost the calculator's result" in html
    assert "http://" not in html.split("window.RUN_DATA")[0] and "https://" not in html.split("window.RUN_DATA")[0]
    assert "<script src" not in html and '<link rel="stylesheet"' not in html


# ---- in the browser ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with chromium_browser() as browser:
        yield browser


@pytest.fixture(scope="module")
def server_url(run_dir):
    with view_server(run_dir) as url:
        yield url


@pytest.mark.e2e
def test_clicking_through_the_run_in_chromium(run_dir, browser, server_url):
    kinds = _kinds(RunView(run_dir))
    page, errors = open_page(browser, server_url)
    assert page.locator("#steps tr.step").count() == 3
    assert page.locator("#episodes tr.episode").count() == 9
    page.screenshot(path=str(ARTIFACTS / "1-lists.png"))

    # Filters: by status, by failure class, by reward, by a step's policy version.
    page.select_option("#filter-status", "error")
    assert set(page.locator("#episodes tr.episode").evaluate_all("rows => rows.map(r => r.dataset.status)")) == {"error"}
    assert page.locator("#episodes tr.episode").count() == 3
    page.select_option("#filter-status", "")
    page.select_option("#filter-class", "agent")
    assert page.locator("#episodes tr.episode").count() == 3
    page.select_option("#filter-class", "")
    page.fill("#filter-reward-min", "1")
    assert sorted(page.locator("#episodes tr.episode").evaluate_all("rows => rows.map(r => r.dataset.id)")) == sorted(kinds["fork"])
    page.fill("#filter-reward-min", "")
    page.click("#steps tr.step[data-step='3']")  # step 3 started from version 2
    assert page.locator("#episodes tr.episode").count() == 3
    assert page.input_value("#filter-version") == "2"
    page.select_option("#filter-version", "")

    # A failed episode: its reason where it failed.
    page.click(f"#episodes tr.episode[data-id='{kinds['fail'][0]}']")
    failure = page.locator(".node.failed .failure")
    failure.wait_for()
    assert "agent failure (builtins.RuntimeError)" in failure.inner_text()
    assert "lost the calculator's result" in failure.inner_text()
    page.screenshot(path=str(ARTIFACTS / "2-failed-episode.png"))

    # The forked, drifted episode: its tree, marks, rewards, returns, tool calls and token spans.
    page.click(f"#episodes tr.episode[data-id='{kinds['fork'][0]}']")
    page.wait_for_selector(f".episode-view[data-id='{kinds['fork'][0]}']")
    episode = RunView(run_dir).episode(kinds["fork"][0])
    assert page.locator(".node").count() == 4
    assert page.locator(".node.fork > .children > .node").count() == 2
    assert page.locator(".node.drift").count() == 1
    assert "return 0.500" in page.locator(".node.fork > .node-head .return").inner_text()
    assert page.locator(".node.drift > .node-head .reward").inner_text() == "reward 0.500"
    assert page.locator(".tool-call").first.inner_text().startswith("tool call calculator(")
    assert page.locator(".tool-result").first.inner_text() == "tool result: 42"
    sampled = page.locator(".tok[data-mask='1']")
    assert sampled.count() == sum(len(n["output_tokens"]) for n in episode["nodes"])
    assert page.locator(".tok[data-mask='0']").count() == sum(len(n["prompt_tokens"]) for n in episode["nodes"])
    first = sampled.first
    assert first.get_attribute("data-version") == "0" and float(first.get_attribute("data-logprob")) <= 0.0
    page.screenshot(path=str(ARTIFACTS / "3-tree-by-loss-mask.png"), full_page=True)
    by_mask = first.evaluate("t => t.style.background")
    page.select_option("#colour", "logprob")
    by_logprob = first.evaluate("t => t.style.background")
    page.select_option("#colour", "version")
    assert len({by_mask, by_logprob, first.evaluate("t => t.style.background")}) == 3
    page.screenshot(path=str(ARTIFACTS / "4-tree-by-version.png"), full_page=True)

    # The same prompt early and late, side by side.
    page.click("a.compare-link")
    page.wait_for_selector("#compare .side[data-side='late'] .node")
    assert "versions 0" in page.locator("#compare .side[data-side='early'] .episode-head").inner_text()
    assert "versions 2" in page.locator("#compare .side[data-side='late'] .episode-head").inner_text()
    page.screenshot(path=str(ARTIFACTS / "5-early-and-late.png"))
    assert errors == []
    page.close()


@pytest.mark.e2e
def test_the_static_page_works_from_a_file_in_chromium(run_dir, browser, tmp_path):
    out = tmp_path / "view.html"
    write_html(RunView(run_dir), out)
    kinds = _kinds(RunView(run_dir))
    page, errors = open_page(browser, out.as_uri())
    assert page.locator("#episodes tr.episode").count() == 9
    page.click(f"#episodes tr.episode[data-id='{kinds['tool'][2]}']")
    page.wait_for_selector(f".episode-view[data-id='{kinds['tool'][2]}'] .node")
    assert page.locator(".node").count() == 2
    assert page.locator(".tok[data-mask='1']").first.get_attribute("data-version") == "2"
    page.screenshot(path=str(ARTIFACTS / "6-static-page.png"))
    assert errors == []
    page.close()
