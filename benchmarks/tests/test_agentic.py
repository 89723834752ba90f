"""The agentic benchmark's reading of a run (``benchmarks/agentic.py:training_tool_use``): the
viewer's call records decoded into tool-use statistics per span of weight versions."""

from __future__ import annotations

import json


def test_training_tool_use_reads_a_runs_calls(tmp_path):
    """``benchmarks/agentic.py`` decodes calls.jsonl (the viewer's records) into per-version statistics."""
    from benchmarks.agentic import training_tool_use

    pieces = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>", "\n", "\\boxed{161}", "<|im_end|>", "x"]
    ids = {p: i for i, p in enumerate(pieces)}
    body = '{"name": "calculator", "arguments": {"expression": "23*7"}}'
    pieces.append(body)
    ids[body] = len(pieces) - 1
    pieces.append("161")
    ids["161"] = len(pieces) - 1
    enc = lambda *ps: [ids[p] for p in ps]  # noqa: E731
    call = {"prompt_ids": [], "output_ids": enc("<tool_call>", "\n", body, "\n", "</tool_call>", "<|im_end|>"), "versions": [0]}
    answer = {
        "prompt_ids": enc("<tool_response>", "\n", "161", "\n", "</tool_response>"),
        "output_ids": enc("\\boxed{161}", "<|im_end|>"),
        "versions": [1],
    }
    skip = {"prompt_ids": [], "output_ids": enc("x", "<|im_end|>"), "versions": [3]}
    (tmp_path / "vocab.json").write_text(json.dumps(pieces))
    lines = [{"episode_id": "a", "calls": [call, answer]}, {"episode_id": "b", "calls": [dict(skip)]}]
    (tmp_path / "calls.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    early, late = training_tool_use(tmp_path, parts=2)
    assert early["episodes"] == 1 and early["calls"] == 1.0 and early["used_result"] == 1.0
    assert late["episodes"] == 1 and late["calls"] == 0.0 and late["used_result"] == 0.0
