"""The run evaluating its own agent (data.eval_mode=agent, areal/controller/agent_eval.py) and the tool-use
statistics read off the gateway's records.

- Unit: the parser's count of call markup it could not read (``ParsedOutput.malformed``), streamed
  or not; the used-result rule; one episode's statistics and score from hand-made interactions.
- The gateway (real, on a stand-in engine that answers a fixed text over SGLang's /generate):
  each recorded Interaction says what its reply did with tools, and a session opened with a
  temperature is sampled at it whatever the agent asks.
- A real short run of the agentic config (the calculator agent, sandboxed, on the embedded agent
  model) with data.eval_mode=agent: before/periodic/after rows with per-problem scores and the
  paired test; the statistics equal what the recorded evaluation episodes contain, recomputed
  here from their decoded replies; evaluation episodes are in no trained or training record.

What the model does is emergent (it may or may not call the tool): the run's checks are
relations between records, not values.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import aiohttp
import pytest
from instant_engine import start_instant_engine
from paths import ROOT
from run_checks import run_in_repo
from transformers import AutoTokenizer

from areal.agent.failures import AGENT, POLICY
from areal.controller.agent_eval import episode_score, episode_tool_use, tool_use_means
from areal.controller.evaluation import paired_test
from areal.controller.trajectories import read_saved_trajectories
from areal.embedded import ensure_embedded_model
from areal.embedded.agentic import MALFORMED, ensure_agent_model
from areal.embedded.corpus import CALCULATOR_TOOL
from areal.engine.client import EngineClient
from areal.gateway import Gateway, GatewayConfig, serve_http
from areal.gateway.generation import used_tool_result
from areal.gateway.parsers import StreamParser, parse_output
from areal.gateway.tree import Interaction
from areal.protocol import EpisodeOutcome

# The agentic variant may still be building when these tests start (CI builds it beside the test
# run, areal/embedded/agentic.py's lock): waiting for it counts against pytest's per-test timeout.
pytestmark = [pytest.mark.timeout(1800), pytest.mark.agent_model]

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "23*7"}}\n</tool_call>'
END = ("<|im_end|>", "<|endoftext|>")


# ---- unit --------------------------------------------------------------------------------------


def test_the_parser_counts_the_call_markup_it_cannot_read():
    good = parse_output(CALL, "qwen25", None)
    assert len(good.tool_calls) == 1 and good.malformed == 0
    for form in MALFORMED:  # the agent model's malformed calls: a brace short, arguments not an object, never closed
        bad = parse_output(form.format(e="23*7"), "qwen25", None)
        assert bad.tool_calls == [] and bad.malformed == 1 and "<tool_call>" in bad.content
    mixed = parse_output(f"{CALL}\n{MALFORMED[0].format(e='1+1')}\n{CALL}", "qwen25", None)
    assert (len(mixed.tool_calls), mixed.malformed) == (2, 1)
    assert parse_output("23 * 7 = 161. \\boxed{161}", "qwen25", None).malformed == 0
    assert parse_output(MALFORMED[0].format(e="1"), None, None).malformed == 0  # no tools offered: no call to make
    assert parse_output('{"name": 3}', "llama3", None).malformed == 1  # a llama3 call whose name is not a string
    text = f"Let me see. {MALFORMED[1].format(e='2*3')} then {CALL}"
    for cut in (1, 3, 7):  # streamed in any pieces: the same count
        parser = StreamParser("qwen25", None)
        for i in range(0, len(text), cut):
            parser.feed(text[i : i + cut])
        assert parser.finish()[1].malformed == parse_output(text, "qwen25", None).malformed == 1


def test_a_reply_uses_a_tool_result_when_its_content_holds_one():
    history = [
        {"role": "user", "content": "What is 23*7?"},
        {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": "{}"}}]},
        {"role": "tool", "content": " 161\n"},
    ]
    assert used_tool_result("The calculator says 161. \\boxed{161}", history)
    assert not used_tool_result("23 * 7 = 151. \\boxed{151}", history)  # the result ignored
    assert not used_tool_result("one hundred sixty-one", history)  # reworded: the rule is textual
    assert not used_tool_result("", history)
    assert not used_tool_result("\\boxed{161}", history[:2])  # no tool message in its history
    assert not used_tool_result("anything", [*history[:2], {"role": "tool", "content": "  "}])  # a blank result
    assert not used_tool_result("161", [*history[:2], {"role": "tool", "content": None}])
    assert not used_tool_result("161", [{"role": "user", "content": "161"}])  # only tool messages count


def _interaction(i: int, *, tool_calls: int = 0, malformed: int = 0, used: bool = False, reward: float | None = None) -> Interaction:
    return Interaction(
        id=f"c{i}",
        prompt_ids=[1],
        output_ids=[2],
        output_logprobs=[-0.1],
        version=0,
        finish_reason="stop",
        created=0.0,
        reward=reward,
        tool_calls=tool_calls,
        malformed_tool_calls=malformed,
        used_tool_result=used,
    )


def test_one_episodes_statistics_and_score_from_its_interactions():
    # a malformed call, then a good one, then an answer using its result
    calls = [_interaction(0, malformed=1), _interaction(1, tool_calls=1), _interaction(2, used=True)]
    assert episode_tool_use(calls) == {"calls": 3.0, "tool_calls": 1.0, "malformed_tool_calls": 1.0, "used_tool_result": 1.0}
    # only the final reply's use counts: a reply that quoted the result and then answered without it does not
    assert episode_tool_use([_interaction(0, used=True), _interaction(1)])["used_tool_result"] == 0.0
    assert episode_tool_use([]) == {"calls": 0.0, "tool_calls": 0.0, "malformed_tool_calls": 0.0, "used_tool_result": 0.0}
    means = tool_use_means([episode_tool_use(calls), episode_tool_use([_interaction(0, tool_calls=2)])])
    assert means == {
        "calls_per_episode": 2.0,
        "tool_calls_per_episode": 1.5,
        "malformed_tool_calls_per_episode": 0.5,
        "used_tool_result_share": 0.5,
    }
    assert episode_score(EpisodeOutcome("e", "ok", reward=1.0), calls) == 1.0
    assert episode_score(EpisodeOutcome("e", "ok", rewards_by_id={"c0": 0.25, "c2": 0.5}), calls) == 0.75
    set_through_gateway = [_interaction(0, reward=0.5), _interaction(1), _interaction(2, reward=0.25)]
    assert episode_score(EpisodeOutcome("e", "ok"), set_through_gateway) == 0.75
    assert episode_score(EpisodeOutcome("e", "error", reward=-1.0, failure_class=POLICY), calls) == -1.0  # policy_failure_reward
    assert episode_score(EpisodeOutcome("e", "crashed", reward=1.0, failure_class=AGENT), calls) == 0.0


@pytest.mark.e2e
def test_the_mode_is_auto_by_default_agent_in_the_agentic_demo_and_checked(tmp_path):
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    import areal.train  # noqa: F401  (registers the schema with Hydra's ConfigStore)
    from areal.api.workflow_api import RolloutWorkflow
    from areal.config import DataConfig, TrainConfig
    from areal.controller.loop import Controller

    with initialize_config_dir(str(ROOT / "conf"), version_base=None):
        assert OmegaConf.to_object(compose(config_name="config")).data.eval_mode == "auto"  # single_turn for the built-in agent
        assert OmegaConf.to_object(compose(config_name="agentic")).data.eval_mode == "agent"
    with pytest.raises(ValueError, match="data.eval_mode must be"):
        DataConfig(eval_mode="agentic")

    class Workflow(RolloutWorkflow):  # run by the controller itself: no runner to run it for an evaluation
        async def arun_episode(self, engine, data):
            return None

    with pytest.raises(ValueError, match="data.eval_mode=agent .* RolloutWorkflow"):
        Controller(TrainConfig(data=DataConfig(eval_mode="agent")), tmp_path, agent=Workflow())


# ---- the gateway records it --------------------------------------------------------------------


def _answers_in_turn(answers: list[str], seen: list[dict]):
    """The stand-in engine's answer: ``answers`` in turn, keeping each request's sampling params in ``seen``."""

    def answer(body: dict) -> str:
        seen.append(body["sampling_params"])
        return answers[len(seen) - 1]

    return answer


@pytest.mark.e2e
def test_the_gateway_records_what_each_reply_did_with_tools_and_a_sessions_temperature():
    tok = AutoTokenizer.from_pretrained(ensure_embedded_model(progress=False))
    answers = [MALFORMED[2].format(e="23*7"), CALL, "The calculator says 161. \\boxed{161}", "\\boxed{161}"]
    seen: list[dict] = []

    async def run() -> tuple[list[Interaction], list[Interaction]]:
        engine = await start_instant_engine(tok, _answers_in_turn(answers, seen))
        port = engine.addresses[0][1]
        gateway = Gateway(EngineClient(f"http://127.0.0.1:{port}"), tok, GatewayConfig(tool_parser="qwen25"))
        http, url = await serve_http(gateway)
        try:
            forced, free = gateway.open_session("eval-e", temperature=0.0), gateway.open_session("train-e")
            messages = [{"role": "user", "content": "What is 23*7?"}]
            async with aiohttp.ClientSession() as client:

                async def ask(key: str, msgs: list[dict]) -> dict:
                    body = {"model": "m", "messages": msgs, "tools": [CALCULATOR_TOOL], "temperature": 1.0, "max_tokens": 64}
                    async with client.post(f"{url}/sessions/{key}/v1/chat/completions", json=body) as r:
                        assert r.status == 200, await r.text()
                        return (await r.json())["choices"][0]["message"]

                await ask(forced, messages)  # malformed: the markup comes back as content
                call = await ask(forced, messages)
                tool = {"role": "tool", "tool_call_id": call["tool_calls"][0]["id"], "content": "161"}
                await ask(forced, [*messages, call, tool])
                await ask(free, messages)  # no tool message in its history
            return list(gateway.close_session(forced).interactions.values()), list(gateway.close_session(free).interactions.values())
        finally:
            await http.cleanup()
            await engine.cleanup()

    forced, free = asyncio.run(run())
    assert [(i.tool_calls, i.malformed_tool_calls, i.used_tool_result) for i in forced] == [(0, 1, False), (1, 0, False), (0, 0, True)]
    assert [(i.tool_calls, i.malformed_tool_calls, i.used_tool_result) for i in free] == [(0, 0, False)]
    # the session's temperature, whatever the request asked (1.0); a session without one keeps the request's
    assert [p["temperature"] for p in seen] == [0.0, 0.0, 0.0, 1.0]


# ---- a real run ----------------------------------------------------------------------------------

STEPS, PROBLEMS, SAMPLES = 3, 5, 2


def _train(run_dir: Path, steps: int, *overrides: str) -> subprocess.CompletedProcess:
    ensure_agent_model(progress=False)  # built on first use (minutes), outside the run's timeout
    cmd = [
        sys.executable,
        "-m",
        "areal.train",
        "--config-name",
        "agentic",  # the calculator agent, sandboxed, data.eval_mode=agent
        f"hydra.run.dir={run_dir}",
        f"trainer.steps={steps}",
        "trainer.checkpoint_every=0",
        "rollout.groups_per_step=1",
        "rollout.n_samples=4",
        f"data.eval_size={PROBLEMS}",
        f"data.eval_samples={SAMPLES}",
        *overrides,
    ]
    return run_in_repo(cmd, timeout_s=600)


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess]:
    run_dir = tmp_path_factory.mktemp("agent-eval") / "run"
    return run_dir, _train(run_dir, STEPS, "data.eval_every=1", "save_trajectories=true")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _reply(text: str) -> str:
    for end in END:
        text = text.replace(end, "")
    return text


@pytest.mark.e2e
def test_the_run_scores_its_agent_before_during_and_after_with_the_paired_test(run):
    run_dir, proc = run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    before, after = summary["eval_before"], summary["eval_after"]
    assert summary["eval_mode"] == before["mode"] == after["mode"] == "agent"
    for e in (before, after):
        assert (e["n"], e["samples"]) == (PROBLEMS, SAMPLES)
        assert len(e["per_problem_sampled"]) == len(e["per_problem_greedy"]) == PROBLEMS
        assert e["sampled_acc"] == pytest.approx(sum(e["per_problem_sampled"]) / PROBLEMS)
    assert summary["eval_test"] == paired_test(before["per_problem_sampled"], after["per_problem_sampled"])
    assert max(after["served_versions"]) == STEPS and before["served_versions"] == [0]

    rows = _jsonl(run_dir / "evals.jsonl")
    names = [r["name"] for r in rows]
    assert names[0] == "before" and names[-1] == "after" and set(names[1:-1]) <= {"periodic"}
    stats = ("calls_per_episode", "tool_calls_per_episode", "malformed_tool_calls_per_episode", "used_tool_result_share")
    for r in rows:  # the trackers' rows: every figure, lists left out
        assert all(isinstance(r[k], float) for k in stats) and r["failed_episodes"] >= 0
        assert "per_problem_sampled" not in r
    assert [rows[0][k] for k in stats] == [before[k] for k in stats] and [rows[-1][k] for k in stats] == [after[k] for k in stats]
    assert "held-out agent" in proc.stdout and "held-out tool use per episode" in proc.stdout


@pytest.mark.e2e
def test_the_statistics_are_those_of_the_recorded_evaluation_episodes(run):
    """Each evaluation's row equals what its lines in eval_episodes.jsonl hold, counted here again
    from the decoded replies with the gateway's parser (not from the Interaction fields)."""
    run_dir, proc = run
    assert proc.returncode == 0, proc.stderr[-5000:]
    rows = _jsonl(run_dir / "evals.jsonl")
    lines = _jsonl(run_dir / "eval_episodes.jsonl")
    by_eval: dict[int, list[dict]] = {}
    for line in lines:  # ids: eval<k>-<name>-v<version>-p<problem>-s<sample>|greedy, k counting the evaluations
        by_eval.setdefault(int(line["episode_id"].split("-")[0][4:]), []).append(line)
    assert sorted(by_eval) == list(range(1, len(rows) + 1))  # one evaluation per row, in order
    for k, row in enumerate(rows, 1):
        eps = by_eval[k]
        assert {e["eval"] for e in eps} == {row["name"]} and len(eps) == PROBLEMS * (SAMPLES + 1)
        sampled = [e for e in eps if e["sample"] != "greedy"]
        greedy = sorted((e for e in eps if e["sample"] == "greedy"), key=lambda e: e["problem"])
        assert sorted((e["problem"], e["sample"]) for e in sampled) == [(i, j) for i in range(PROBLEMS) for j in range(SAMPLES)]
        per_problem = [sum(e["score"] for e in sampled if e["problem"] == i) / SAMPLES for i in range(PROBLEMS)]
        assert row["sampled_acc"] == pytest.approx(sum(per_problem) / PROBLEMS)
        assert row["greedy_acc"] == pytest.approx(sum(e["score"] for e in greedy) / PROBLEMS)
        if row["name"] in ("before", "after"):
            summary = json.loads((run_dir / "summary.json").read_text())[f"eval_{row['name']}"]
            assert summary["per_problem_sampled"] == pytest.approx(per_problem)
            assert summary["per_problem_greedy"] == pytest.approx([e["score"] for e in greedy])
        parsed = [[parse_output(_reply(r), "qwen25", None) for r in e["replies"]] for e in sampled]
        well_formed = [sum(len(p.tool_calls) for p in ps) for ps in parsed]
        malformed = [sum(p.malformed for p in ps) for ps in parsed]
        assert [e["tool_calls"] for e in sampled] == well_formed and [e["malformed_tool_calls"] for e in sampled] == malformed
        n = len(sampled)
        assert row["calls_per_episode"] == pytest.approx(sum(len(e["replies"]) for e in sampled) / n)
        assert row["tool_calls_per_episode"] == pytest.approx(sum(well_formed) / n)
        assert row["malformed_tool_calls_per_episode"] == pytest.approx(sum(malformed) / n)
        assert row["used_tool_result_share"] == pytest.approx(sum(e["used_tool_result"] for e in sampled) / n)
        assert row["failed_episodes"] == sum(e["status"] != "ok" for e in eps)
        for e in eps:
            # the calculator agent answers a tool message only after a well-formed call, and
            # calls the model once per reply that made one
            assert not e["used_tool_result"] or e["tool_calls"] >= 1
            assert e["calls"] == len(e["replies"]) <= 4
            assert e["used_tool_result"] in (0, 1) and 0 <= e["score"] <= 1


@pytest.mark.e2e
def test_evaluation_episodes_are_never_trained_nor_counted_with_the_training_episodes(run):
    run_dir, proc = run
    assert proc.returncode == 0, proc.stderr[-5000:]
    evaluated = {e["episode_id"] for e in _jsonl(run_dir / "eval_episodes.jsonl")}
    assert evaluated and all(i.startswith("eval") for i in evaluated)
    episodes = _jsonl(run_dir / "episodes.jsonl")
    trained = {i for path in run_dir.glob("trained_episodes-r*.jsonl") for line in _jsonl(path) for i in line["episodes"]}
    saved = {t.episode_id for t in read_saved_trajectories(run_dir / "trajectories.bin")}
    recorded = {c["episode_id"] for c in _jsonl(run_dir / "calls.jsonl")}
    assert trained and saved
    for ids in ({e["episode_id"] for e in episodes}, trained, saved, recorded):
        assert not ids & evaluated and not any(i.startswith("eval") for i in ids)
    metrics = _jsonl(run_dir / "metrics.jsonl")
    # the steps' windows hold training episodes only (the evaluations ran 3x as many)
    assert sum(v for m in metrics for k, v in m.items() if k.startswith("episodes_")) <= len(episodes) < len(evaluated)


@pytest.mark.e2e
def test_training_episodes_carry_their_malformed_calls_and_each_step_the_mean(run):
    """episodes.jsonl's tool_calls / malformed_tool_calls equal the counts in the episode's calls
    in calls.jsonl (decoded with vocab.json and parsed here); metrics.jsonl has the per-step means."""
    run_dir, proc = run
    assert proc.returncode == 0, proc.stderr[-5000:]
    pieces = json.loads((run_dir / "vocab.json").read_text())
    calls = {c["episode_id"]: c["calls"] for c in _jsonl(run_dir / "calls.jsonl")}
    episodes = _jsonl(run_dir / "episodes.jsonl")
    checked = 0
    for e in episodes:
        assert isinstance(e["malformed_tool_calls"], int) and e["malformed_tool_calls"] >= 0
        if e["episode_id"] in calls:
            texts = [_reply("".join(pieces[i] for i in c["output_ids"])) for c in calls[e["episode_id"]]]
            parsed = [parse_output(t, "qwen25", None) for t in texts]
            assert e["tool_calls"] == sum(len(p.tool_calls) for p in parsed)
            assert e["malformed_tool_calls"] == sum(p.malformed for p in parsed)
            checked += 1
    assert checked > 0
    metrics = _jsonl(run_dir / "metrics.jsonl")
    assert all("malformed_tool_calls_per_episode" in m for m in metrics if "calls_per_episode" in m)
    means = [m["malformed_tool_calls_per_episode"] for m in metrics if "malformed_tool_calls_per_episode" in m]
    assert means and all(0 <= x <= max(e["malformed_tool_calls"] for e in episodes) for x in means)


@pytest.mark.e2e
def test_an_inline_agent_is_evaluated_inline(tmp_path):
    """rollout.openai.mode=inline: the evaluation runs the agent on the controller's loop, as the
    training episodes do; the same rows and lines, nothing sandboxed."""
    run_dir = tmp_path / "run"
    proc = _train(run_dir, 1, "rollout.openai.mode=inline", "data.eval_temperature=0.5")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_mode"] == "agent" and summary["eval_test"]["n"] == PROBLEMS
    lines = _jsonl(run_dir / "eval_episodes.jsonl")
    assert [e["eval"] for e in lines].count("before") == [e["eval"] for e in lines].count("after") == PROBLEMS * (SAMPLES + 1)
    assert not (run_dir / "sandbox").exists()
