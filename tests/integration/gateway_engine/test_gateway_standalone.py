"""``python -m areal.gateway`` as a user runs it: a real subprocess on the embedded model (its engine a
subprocess of its own), driven through the base URLs and the key it prints, stopped with SIGTERM.

Checks: the openai SDK (chat, a follow-up turn, Responses, a streamed chat) and the anthropic SDK
get answers; after SIGTERM the gateway exits 0, its engine no longer answers, and the record
directory holds every call token by token (prompt ids, sampled ids, logprobs) exactly as the
gateway recorded it (``/v1/interactions/<id>``) and as the client received the logprobs, grouped
into conversations (the follow-up a child of the first call); the run viewer, started on the
directory, lists those conversations and serves their trees. Bad input (a model path that is no
model, a port in use) is refused before anything starts, with a message naming it.
"""

from __future__ import annotations

import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from anthropic import Anthropic
from openai import OpenAI
from paths import ROOT

from areal.engine.launch import free_port

READY_S = 300  # the engine's start on a loaded two-core machine


class Gateway:
    """``python -m areal.gateway`` in a subprocess; its stdout read by a thread, line by line."""

    def __init__(self, record: Path, *args: str) -> None:
        self.stderr = open(record.parent / f"{record.name}.stderr", "w+")
        cmd = [sys.executable, "-m", "areal.gateway", "--port", "0", "--record", str(record), *args]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=self.stderr, text=True)
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.out: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def ready(self) -> dict[str, str]:
        """The variables of the ``export`` lines, once the gateway printed them all."""
        env: dict[str, str] = {}
        deadline = time.monotonic() + READY_S
        while "ANTHROPIC_API_KEY" not in env:
            line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            assert line is not None, f"the gateway exited ({self.proc.wait()}): {''.join(self.out)}{self.err()}"
            self.out.append(line)
            if line.startswith("export "):
                env.update(pair.split("=", 1) for pair in line.split()[1:])
        return env

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGTERM)
        code = self.proc.wait(timeout=60)
        while (line := self.lines.get(timeout=10)) is not None:
            self.out.append(line)
        return code

    def err(self) -> str:
        self.stderr.seek(0)
        return self.stderr.read()


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _full_prompts(calls: list[dict]) -> dict[str, list[int]]:
    """Each recorded call's whole prompt: its parent's prompt + output, then the ids it adds."""
    whole: dict[str, list[int]] = {}
    for c in calls:
        shared = whole[c["parent"]] + next(p["output_ids"] for p in calls if p["id"] == c["parent"]) if c["parent"] else []
        whole[c["id"]] = shared + c["prompt_ids"]
    return whole


def test_the_gateway_alone_serves_every_api_records_every_call_and_stops_cleanly(tmp_path: Path):
    record = tmp_path / "record"
    gw = Gateway(record)
    try:
        env = gw.ready()
        base, key = env["OPENAI_BASE_URL"], env["OPENAI_API_KEY"]
        assert env["ANTHROPIC_API_KEY"] == key and base == env["ANTHROPIC_BASE_URL"] + "/v1"
        engine_url = next(line for line in gw.out if "engine at " in line).split("engine at ")[1].strip()

        openai = OpenAI(base_url=base, api_key=key, max_retries=0)
        question = [{"role": "user", "content": "What is 3 + 4?"}]
        first = openai.chat.completions.create(model="m", messages=question, max_tokens=16, logprobs=True)
        reply = first.choices[0].message
        history = [*question, reply.model_dump(exclude_none=True)]
        history += [{"role": "tool", "tool_call_id": c.id, "content": "7"} for c in reply.tool_calls or []]
        follow_up = openai.chat.completions.create(model="m", messages=[*history, {"role": "user", "content": "Sure?"}], max_tokens=16)
        response = openai.responses.create(model="m", input="What is 2 + 2?", max_output_tokens=16)
        chunks = list(openai.chat.completions.create(model="m", messages=question, max_tokens=16, stream=True))
        message = Anthropic(base_url=env["ANTHROPIC_BASE_URL"], api_key=key, max_retries=0).messages.create(
            model="m", max_tokens=16, messages=[{"role": "user", "content": "What is 1 + 1?"}]
        )
        ids = [first.id, follow_up.id, response.id, chunks[0].id, message.id]
        served = {i: httpx.get(f"{base}/interactions/{i}", headers={"Authorization": f"Bearer {key}"}).json() for i in ids}
    finally:
        code = gw.stop()
    assert code == 0, gw.err()
    with pytest.raises(httpx.ConnectError):  # the engine it launched is gone with it
        httpx.get(engine_url + "/health")

    calls = {}  # the viewer's rule: a later line of a conversation replaces an earlier one
    for line in _jsonl(record / "calls.jsonl"):
        calls[line["episode_id"]] = line["calls"]
    episodes = {e["episode_id"]: e for e in _jsonl(record / "episodes.jsonl")}
    roots = [first.id, response.id, chunks[0].id, message.id]
    assert list(calls) == roots and list(episodes) == roots
    assert [c["id"] for c in calls[first.id]] == [first.id, follow_up.id]
    assert calls[first.id][1]["parent"] == first.id  # the follow-up extends the first call's tokens
    recorded = {c["id"]: (c, whole) for tree in calls.values() for c, whole in zip(tree, _full_prompts(tree).values())}
    for i in ids:
        call, prompt = recorded[i]
        assert prompt == served[i]["prompt_ids"], i
        assert call["output_ids"] == served[i]["output_ids"] and len(call["output_ids"]) > 0, i
        assert call["logprobs"] == [round(x, 4) for x in served[i]["output_logprobs"]], i
    # what the client was given: every sampled token's logprob but the end-of-turn token's
    received, kept = [round(t.logprob, 4) for t in first.choices[0].logprobs.content], recorded[first.id][0]["logprobs"]
    assert received == kept[: len(received)] and len(kept) - len(received) in (0, 1)
    assert f"calls recorded: {len(ids)}, in conversations: {len(roots)}," in gw.out[-1]

    port = free_port()
    viewer = subprocess.Popen([sys.executable, "-m", "areal.view", str(record), "--port", str(port)], cwd=ROOT, stdout=subprocess.DEVNULL)
    try:
        listed = _get(f"http://127.0.0.1:{port}/api/episodes")
        assert [e["episode_id"] for e in listed] == roots and all(e["status"] == "ok" and e["tree"] for e in listed)
        tree = _get(f"http://127.0.0.1:{port}/api/episode/{first.id}")
        assert [n["id"] for n in tree["nodes"]] == [first.id, follow_up.id] and tree["nodes"][0]["children"] == [follow_up.id]
        assert [t[1] for t in tree["nodes"][0]["output_tokens"]] == recorded[first.id][0]["logprobs"]
    finally:
        viewer.terminate()
        viewer.wait(timeout=30)


def _get(url: str, timeout_s: float = 60) -> object:
    """GET ``url``'s JSON, once the server listens."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            return httpx.get(url, timeout=10).raise_for_status().json()
        except httpx.ConnectError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_a_model_path_that_is_no_model_is_refused_before_anything_starts(tmp_path: Path):
    record = tmp_path / "record"
    gw = Gateway(record, f"model.path={tmp_path / 'no-such-model'}")
    assert gw.proc.wait(timeout=120) == 2
    err = gw.err()
    assert "model.path" in err and str(tmp_path / "no-such-model") in err and "Traceback" not in err
    assert not record.exists()


def test_a_port_in_use_is_refused_naming_it(tmp_path: Path):
    with socket.create_server(("127.0.0.1", 0)) as busy:
        port = busy.getsockname()[1]
        proc = subprocess.run(
            [sys.executable, "-m", "areal.gateway", "--port", str(port), "--record", str(tmp_path / "record")],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert proc.returncode == 2
    assert f"--port {port}" in proc.stderr and "in use" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "record").exists()
