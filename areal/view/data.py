"""A run directory read back for the viewer: steps, episodes, and each episode's conversation tree.

    metrics.jsonl   ─► steps()                 one row per optimizer step (the page: reward, loss, reward/<task> as a
                                               column and a curve each, for runs whose rows name a task)
    episodes.jsonl  ─► episodes()              one row per started episode (status, failure, reward)
    calls.jsonl     ─► episode(id)             its calls as a tree: messages, tool calls, tokens
    vocab.json      ─┘                         every token id's text (no tokenizer, no model needed)
    config.json     ─► the discount of returns (trainer.turn_discount; 1 when the run has none)

A call's tokens: the prompt tokens it adds to its parent's prompt + output (loss mask 0), then
its sampled tokens (loss mask 1) with the engine's logprob and the policy version that sampled
each. Messages are read off the decoded text by the ChatML markers (``<|im_start|>role``), tool
calls off ``<tool_call>{json}</tool_call>`` and tool results off ``<tool_response>``; text of
another template is shown as one block.

Tree marks: a call with several children is a fork; a call with no parent after the first is a
new branch because the agent rewrote its history (the gateway counts it as drift). An episode
branched at a model call (rollout.branch, docs/branching.md) is listed as one episode per branch
(``<trunk id>/b<i>``): its calls before the branch point are marked ``shared`` (its siblings made
them too, and the tree trained them once), its first own call is the ``branch_point``, naming the
trunk, the call and the sibling branches. Returns:
G = r + γ · mean(G of the children), r the call's own reward (set through the gateway or named by
run()'s {id: reward}); an episode whose reward came as one float has it on its last call.

The writers of calls.jsonl's lines and of vocab.json are here too (``call_tree_line``,
``vocabulary``), beside their reader: a run's records (``areal/controller/records.py``) and the
gateway on its own (``areal/gateway/standalone.py``) write with them. A later line of an episode
replaces an earlier one, in episodes.jsonl and calls.jsonl alike (the gateway on its own writes a
conversation again when it has grown).

Covered: runs written by ``areal/controller/records.py`` (calls.jsonl may be absent: episodes are then
listed without trees), and the record directories of ``python -m areal.gateway`` (no steps; one
episode per conversation). Not covered: trajectories.bin (the trained rows; this reads the calls).
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from areal.jsonl import json_line

MESSAGE = re.compile(r"<\|im_start\|>(\w+)\n(.*?)(?:<\|im_end\|>|$)", re.S)
TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.S)
TOOL_RESPONSE = re.compile(r"<tool_response>\s*(.*?)\s*(?:</tool_response>|$)", re.S)
LIST_ERROR_CHARS = 300  # of a failure's reason in the episode list (the episode page has it whole)


def call_tree_line(episode_id: str, calls: Sequence[Any], rewards: dict[str, tuple[float | None, float | None]]) -> str:
    """One episode's line of calls.jsonl: each call (a gateway ``Interaction``) with only the
    prompt tokens it adds to its parent's prompt + output; ``rewards``: each call's own reward and
    the reward its row is trained with (a call not in it: its own, and None)."""
    seen = {c.id: c for c in calls}
    out = []
    for c in calls:
        parent = seen.get(c.parent_id) if c.parent_id else None
        shared = len(parent.prompt_ids) + len(parent.output_ids) if parent is not None else 0
        out.append(
            {
                "id": c.id,
                "parent": parent.id if parent is not None else None,
                "prompt_ids": list(c.prompt_ids[shared:]),
                "output_ids": list(c.output_ids),
                "logprobs": [round(x, 4) for x in c.output_logprobs],
                "versions": list(c.output_versions) or [c.version] * len(c.output_ids),
                "finish_reason": c.finish_reason,
                "reward": rewards.get(c.id, (c.reward, None))[0],
                "trained": rewards.get(c.id, (c.reward, None))[1],
            }
        )
    return json_line({"episode_id": episode_id, "calls": out})


def vocabulary(tokenizer: Any) -> list[str]:
    """vocab.json's content: the text of every token id, so the viewer decodes without the model."""
    return [tokenizer.decode([i]) for i in range(len(tokenizer))]


def _jsonl(path: Path) -> list[dict[str, Any]]:
    """The lines of a .jsonl file; a last line cut by a killed run is left out."""
    if not path.is_file():
        return []
    text = path.read_text()
    lines = [line for line in text.splitlines() if line.strip()]
    if lines and not text.endswith("\n"):
        with contextlib.suppress(json.JSONDecodeError):
            json.loads(lines[-1])
            return [json.loads(line) for line in lines]
        lines.pop()
    return [json.loads(line) for line in lines]


class RunView:
    """Everything the page shows about one run directory, as JSON-ready dicts."""

    def __init__(self, run_dir: Path) -> None:
        if not (run_dir / "episodes.jsonl").is_file():
            raise FileNotFoundError(f"{run_dir} holds no episodes.jsonl: not a run directory of areal.train")
        self.run_dir = run_dir
        config_path = run_dir / "config.json"
        self.config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        self.gamma = float(self.config.get("trainer", {}).get("turn_discount", 1.0))
        self.metrics = _jsonl(run_dir / "metrics.jsonl")
        self.records = {e["episode_id"]: e for e in _jsonl(run_dir / "episodes.jsonl")}
        vocab_path = run_dir / "vocab.json"
        self.vocab: list[str] = json.loads(vocab_path.read_text()) if vocab_path.is_file() else []
        # a resumed run's calls.jsonl may still hold episodes its episodes.jsonl was cut back from
        self.trees = {t["episode_id"]: t["calls"] for t in _jsonl(run_dir / "calls.jsonl") if t["episode_id"] in self.records}
        # episodes that share their first prompt, by its token ids: the same question early and late
        self.prompt_of = {eid: tuple(calls[0]["prompt_ids"]) for eid, calls in self.trees.items() if calls}

    # ---- lists ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        summary_path = self.run_dir / "summary.json"
        return {
            "run_dir": str(self.run_dir),
            "experiment": self.config.get("experiment_name", ""),
            "agent": self.config.get("rollout", {}).get("agent", ""),
            "model": self.config.get("model", {}).get("path", ""),
            "gamma": self.gamma,
            "summary": json.loads(summary_path.read_text()) if summary_path.is_file() else None,
        }

    def steps(self) -> list[dict[str, Any]]:
        return self.metrics

    def episodes(self) -> list[dict[str, Any]]:
        out = []
        for e in self.records.values():
            row = {k: e.get(k) for k in ("episode_id", "group_id", "status", "failure_class", "failure_cause", "reward", "versions")}
            row |= {"calls": e.get("interactions", 0), "drift": e.get("drift", 0), "error": (e.get("error") or "")[:LIST_ERROR_CHARS]}
            row["tree"] = e["episode_id"] in self.trees
            if "branch_of" in e:
                row["branch"] = {
                    "of": e["branch_of"],
                    "index": e.get("branch_index"),
                    "call": e.get("branch_call"),
                    "entropy": e.get("branch_entropy"),
                }
            out.append(row)
        return out

    def prompts(self) -> list[dict[str, Any]]:
        """Prompts sampled at two or more policy versions: their episodes, earliest first."""
        groups: dict[tuple, list[str]] = {}
        for eid, key in self.prompt_of.items():
            groups.setdefault(key, []).append(eid)
        out = []
        for key, eids in groups.items():
            eids.sort(key=self._first_version)
            if self._first_version(eids[0]) == self._first_version(eids[-1]):
                continue
            question = next((m["content"] for m in _messages(self._text(list(key))) if m["role"] == "user"), self._text(list(key)))
            out.append({"prompt": question[-300:], "episodes": [self._brief(e) for e in eids]})
        return sorted(out, key=lambda p: -len(p["episodes"]))

    def compare(self, episode_id: str) -> dict[str, Any]:
        """The ids of the earliest and the latest episode of ``episode_id``'s first prompt."""
        self._record(episode_id)
        key = self.prompt_of.get(episode_id)
        same = sorted((e for e, k in self.prompt_of.items() if k == key), key=self._first_version) if key else [episode_id]
        return {"early": same[0], "late": same[-1], "count": len(same)}

    # ---- one episode ---------------------------------------------------------------------

    def episode(self, episode_id: str) -> dict[str, Any]:
        record = self._record(episode_id)
        calls = self.trees.get(episode_id, [])
        nodes = [self._node(c) for c in calls]
        by_id = {n["id"]: n for n in nodes}
        for n in nodes:
            if n["parent"] in by_id:
                by_id[n["parent"]]["children"].append(n["id"])
        for i, n in enumerate(nodes):
            n["fork"] = len(n["children"]) > 1
            n["drift"] = i > 0 and n["parent"] is None  # its history matched no earlier reply
        own = [c["reward"] for c in calls]
        if nodes and all(r is None for r in own):  # one float for the episode: it rewards the last call
            own[-1] = record.get("reward")
        for n, r in zip(nodes, own):
            n["reward"] = r
        branch = self._branch(record)
        if branch is not None:
            shared = int(record.get("shared_interactions") or 0)
            for n in nodes[:shared]:
                n["shared"] = True
            if shared < len(nodes):
                nodes[shared]["branch_point"] = branch
        for n in reversed(nodes):  # children come after their parent: one reverse pass
            kids = [by_id[k]["return"] for k in n["children"]]
            n["return"] = (n["reward"] or 0.0) + self.gamma * (sum(kids) / len(kids) if kids else 0.0)
        failed = record.get("status") != "ok" or bool(record.get("failure_class"))
        failure = {k: record.get(k) for k in ("status", "failure_class", "failure_cause", "error", "log_tail")} if failed else None
        if failure and nodes:
            nodes[-1]["failure"] = failure  # the episode failed after its last call
        return {"record": record, "nodes": nodes, "failure": failure, "gamma": self.gamma, "recorded": bool(calls), "branch": branch}

    def _branch(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """A branch's place (None for an episode that is no branch): its trunk, the call it branched
        at, its index, and its siblings' episode ids in branch order."""
        if "branch_of" not in record:
            return None
        trunk = record["branch_of"]
        siblings = sorted(
            (e for e in self.records.values() if e.get("branch_of") == trunk and e["episode_id"] != record["episode_id"]),
            key=lambda e: e.get("branch_index", 0),
        )
        return {
            "of": trunk,
            "call": record.get("branch_call"),
            "index": record.get("branch_index"),
            "entropy": record.get("branch_entropy"),  # the branch point's sampled entropy, when found by entropy
            "siblings": [e["episode_id"] for e in siblings],
        }

    def _node(self, call: dict[str, Any]) -> dict[str, Any]:
        prompt_text = self._text(call["prompt_ids"])
        output_pieces = self._pieces(call["output_ids"])
        output_text = "".join(output_pieces)
        return {
            "id": call["id"],
            "parent": call["parent"],
            "children": [],
            "messages": _messages(prompt_text),
            "output": _messages("<|im_start|>assistant\n" + output_text)[0] if output_text else {"role": "assistant", "content": ""},
            "prompt_tokens": self._pieces(call["prompt_ids"]),
            # per sampled token: [text, logprob, policy version]
            "output_tokens": [[p, lp, v] for p, lp, v in zip(output_pieces, call["logprobs"], call["versions"])],
            "finish_reason": call["finish_reason"],
            "trained": call.get("trained"),
        }

    # ---- helpers -------------------------------------------------------------------------

    def _record(self, episode_id: str) -> dict[str, Any]:
        if episode_id not in self.records:
            raise KeyError(f"no episode {episode_id!r} in {self.run_dir}")
        return self.records[episode_id]

    def _first_version(self, episode_id: str) -> int:
        return min(self.records.get(episode_id, {}).get("versions") or [0])

    def _brief(self, episode_id: str) -> dict[str, Any]:
        e = self.records.get(episode_id, {})
        return {"episode_id": episode_id, "versions": e.get("versions"), "reward": e.get("reward"), "status": e.get("status")}

    def _pieces(self, ids: list[int]) -> list[str]:
        n = len(self.vocab)
        return [self.vocab[i] if 0 <= i < n else f"<id {i}>" for i in ids]

    def _text(self, ids: list[int]) -> str:
        return "".join(self._pieces(ids))


def _messages(text: str) -> list[dict[str, Any]]:
    """Messages of a ChatML text (a template's generation prompt, the empty last assistant
    header, dropped); tool calls and tool results parsed out of their content."""
    found = [(m.group(1), m.group(2).strip()) for m in MESSAGE.finditer(text)]
    if not found:
        return [{"role": "text", "content": text}] if text.strip() else []
    if found[-1] == ("assistant", ""):
        found.pop()
    out = []
    for role, content in found:
        # only an assistant calls tools and only a user or tool turn answers them (a system prompt
        # may show the format, tag included)
        calls = [_tool_call(raw) for raw in TOOL_CALL.findall(content)] if role == "assistant" else []
        results = TOOL_RESPONSE.findall(content) if role in ("user", "tool") else []
        if calls:
            content = TOOL_CALL.sub("", content).strip()
        if results:
            content = TOOL_RESPONSE.sub("", content).strip()
        message: dict[str, Any] = {"role": role, "content": content}
        if calls:
            message["tool_calls"] = calls
        if results:
            message["tool_results"] = results
        out.append(message)
    return out


def _tool_call(raw: str) -> dict[str, Any]:
    """``{name, arguments}`` of a tool call's JSON, or ``{malformed: raw}`` when it does not parse."""
    try:
        call = json.loads(raw)
    except json.JSONDecodeError:
        return {"malformed": raw}
    if not isinstance(call, dict) or "name" not in call:
        return {"malformed": raw}
    return {"name": call["name"], "arguments": call.get("arguments")}
