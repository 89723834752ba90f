"""Your data, your reward, your model, from the main CLI: ``data.train`` / ``data.eval`` from a
parquet file or a ``datasets`` folder with a field mapping, ``reward`` as an import path with
AReaL's signature, ``model.path`` as a hub id resolved through the HF cache."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import Dataset, DatasetDict
from run_checks import agent_cmd, read_jsonl, run_in_repo

from areal.dataset import load_rows
from areal.utils.hf_utils import resolve_model_path

ROWS = [{"problem": f"What is {i} + {i}?", "solution": str(2 * i), "difficulty": i % 3} for i in range(8)]
AGENT = """
from openai import AsyncOpenAI

async def run(data, **kw):  # returns no reward: the run's `reward` function scores the reply
    client = AsyncOpenAI(base_url=kw["base_url"], api_key=kw["api_key"], http_client=kw.get("http_client"), max_retries=0)
    await client.chat.completions.create(model="m", messages=data["messages"], max_tokens=8)
"""
REWARD = """
def reward(prompt, completions, prompt_ids, completion_ids, answer, difficulty, **row):
    assert isinstance(completions, str) and completion_ids and prompt_ids and "+" in prompt
    return float(difficulty) + (0.5 if answer == "4" else 0.0)  # a function of the row's own columns
"""


def _write_parquet(path: Path, rows: list[dict]) -> None:
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_rows_load_the_same_from_every_format_with_a_field_mapping(tmp_path):
    _write_parquet(tmp_path / "d.parquet", ROWS)
    (tmp_path / "d.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    (tmp_path / "d.json").write_text(json.dumps(ROWS))
    DatasetDict({"train": Dataset.from_list(ROWS), "test": Dataset.from_list(ROWS[:2])}).save_to_disk(str(tmp_path / "dd"))
    Dataset.from_list(ROWS).save_to_disk(str(tmp_path / "ds"))
    loads = {
        name: load_rows(str(tmp_path / name), "train", prompt_key="problem", answer_key="solution")
        for name in ("d.parquet", "d.jsonl", "d.json", "dd", "ds")
    }
    for name, rows in loads.items():
        assert [r["question"] for r in rows] == [r["problem"] for r in ROWS], name
        assert [r["answer"] for r in rows] == [r["solution"] for r in ROWS], name
        assert [r["difficulty"] for r in rows] == [r["difficulty"] for r in ROWS], name  # other columns kept
        assert rows[0]["messages"] == [{"role": "user", "content": "What is 0 + 0?"}]
    assert len(load_rows(str(tmp_path / "dd"), "test", prompt_key="problem", answer_key="solution")) == 2


def test_bad_data_is_refused_naming_what_is_wrong(tmp_path):
    _write_parquet(tmp_path / "d.parquet", ROWS)
    with pytest.raises(ValueError, match="no column 'question_text'"):
        load_rows(str(tmp_path / "d.parquet"), prompt_key="question_text", answer_key="solution")
    with pytest.raises(ValueError, match="has no `answer`"):
        load_rows(str(tmp_path / "d.parquet"), prompt_key="problem")
    (tmp_path / "bad.jsonl").write_text('{"question": "a", "answer": "1"}\n{not json\n')
    with pytest.raises(ValueError, match="line 2: not JSON"):
        load_rows(str(tmp_path / "bad.jsonl"))
    (tmp_path / "rows.csv").write_text("question,answer\n")
    with pytest.raises(ValueError, match=".jsonl, .json or .parquet"):
        load_rows(str(tmp_path / "rows.csv"))
    DatasetDict({"train": Dataset.from_list(ROWS)}).save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(ValueError, match="splits \\['train'\\], not 'validation'"):
        load_rows(str(tmp_path / "dd"), "validation", prompt_key="problem", answer_key="solution")


def test_a_hub_id_resolves_through_the_hf_cache_offline(tmp_path, monkeypatch):
    """A model in the HF cache layout (models--org--name/snapshots/<rev>, refs/main) is found by
    its hub id with the network forbidden; one that is not cached is refused, naming it."""
    model = Path(resolve_model_path("scripted"))
    repo = tmp_path / "hub" / "models--acme--tiny-chat"
    snapshot = repo / "snapshots" / ("a" * 40)
    shutil.copytree(model, snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("a" * 40)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    code = "from areal.utils.hf_utils import resolve_model_path as r; import sys; print(r(sys.argv[1]))"
    out = subprocess.run([sys.executable, "-c", code, "acme/tiny-chat"], capture_output=True, text=True, env=os.environ)
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == snapshot
    missing = subprocess.run([sys.executable, "-c", code, "acme/not-cached"], capture_output=True, text=True, env=os.environ)
    assert missing.returncode != 0 and "'acme/not-cached' is neither a local directory nor in the HF cache" in missing.stderr


def _two_steps(tmp_path: Path, groups: int, *overrides: str) -> tuple[Path, subprocess.CompletedProcess]:
    """Run ``AGENT`` (written to ``tmp_path/agent.py``) for 2 steps of ``groups`` groups of 2
    samples, inline, on the rows' ``problem`` and ``solution`` fields, ``overrides`` last, to its
    end: (the run's folder, the finished process)."""
    run_dir, cmd = agent_cmd(
        tmp_path,
        "agent.py",
        AGENT,
        "data.prompt_key=problem",
        "data.answer_key=solution",
        "rollout.openai.mode=inline",
        "trainer.steps=2",
        f"rollout.groups_per_step={groups}",
        "rollout.n_samples=2",
        *overrides,
    )
    return run_dir, run_in_repo(cmd, timeout_s=600)


@pytest.mark.e2e
@pytest.mark.parametrize("source", ["parquet", "datasets"])
def test_two_steps_train_on_your_data_scored_by_your_reward(tmp_path, source):
    if source == "parquet":
        _write_parquet(tmp_path / "train.parquet", ROWS)
        _write_parquet(tmp_path / "eval.parquet", ROWS[:2])
        data = [f"data.train={tmp_path / 'train.parquet'}", f"data.eval={tmp_path / 'eval.parquet'}"]
    else:
        DatasetDict({"train": Dataset.from_list(ROWS), "test": Dataset.from_list(ROWS[:2])}).save_to_disk(str(tmp_path / "dd"))
        data = [f"data.train={tmp_path / 'dd'}", f"data.eval={tmp_path / 'dd'}"]
    (tmp_path / "my_reward.py").write_text(REWARD)
    reward = (f"reward={tmp_path / 'my_reward.py'}:reward", "rollout.reward_range=[-10,10]")
    run_dir, proc = _two_steps(tmp_path, 2, *reward, "data.eval_samples=1", *data)
    assert proc.returncode == 0, proc.stderr[-4000:]
    episodes = read_jsonl(run_dir / "episodes.jsonl")
    assert episodes and all(e["status"] == "ok" for e in episodes), episodes
    possible = {r["difficulty"] + (0.5 if r["solution"] == "4" else 0.0) for r in ROWS}
    assert {e["reward"] for e in episodes} <= possible and len({e["reward"] for e in episodes}) > 1, episodes
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["eval_before"]["n"] == 2  # the held-out rows, scored by the same function
    assert [json.loads(x)["step"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()] == [1, 2]


@pytest.mark.e2e
def test_an_agent_that_returns_no_reward_without_a_reward_function_is_told_so(tmp_path):
    _write_parquet(tmp_path / "train.parquet", ROWS)
    run_dir, proc = _two_steps(tmp_path, 1, f"data.train={tmp_path / 'train.parquet'}")
    assert proc.returncode != 0
    # no data.eval: the run says it scores no held-out rows, rather than skipping data.eval_size silently
    assert "[eval] none: the training rows came without held-out ones (data.eval names them)" in proc.stdout + proc.stderr
    episodes = read_jsonl(run_dir / "episodes.jsonl")
    # the run stops once its first groups have all failed; an episode still running then is cut and
    # logged as cancelled (timing decides whether one is): every episode that ended was told why
    ended = [e for e in episodes if e["status"] != "cancelled"]
    assert ended and all(e["status"] == "error" and "run() returned None and gave no reward" in e["error"] for e in ended), episodes
    assert all(e["error"].startswith("cancelled before it finished") for e in episodes if e["status"] == "cancelled"), episodes
