"""``get_custom_dataset(split, dataset_config, tokenizer)``: AReaL's dataset loader, for RL prompts.

Rows come back as plain dicts in one shape, whatever the source::

    {"messages": [{"role": "user", "content": q}], "question": q, "answer": a, ...other keys}

``messages`` is what AReaL's agents read (``data["messages"][-1]["content"]``), ``question``
what this project's agents read; both are always present.

Sources (``dataset_config.path``):
- ``"embedded"``: the built-in arithmetic word problems (``areal.embedded.corpus``), train/test
  splits that never share a question. The result is an ``EmbeddedDataset`` (a list) that
  remembers split, size and seed, so the trainer can hand the controller its own task.
- a ``.jsonl`` / ``.json`` file, or a directory holding ``<split>.jsonl``: rows with ``messages``,
  ``question`` or ``prompt``, and ``answer`` (GSM8K's raw rows work as they are).
Hub names (``openai/gsm8k``) are refused: nothing here downloads; save the split as JSONL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from areal.api.cli_args import DatasetConfig

DEFAULT_SIZES = {"train": 4000, "test": 500}


class EmbeddedDataset(list):
    """Rows of the embedded task, with how they were made (``split``, ``seed``)."""

    def __init__(self, rows: list[dict[str, Any]], split: str, seed: int) -> None:
        super().__init__(rows)
        self.split = split
        self.seed = seed


def get_custom_dataset(split: str, dataset_config: DatasetConfig, tokenizer: Any = None, seed: int = 1,
                       **kwargs: Any) -> list[dict[str, Any]]:
    """The rows of ``split`` ("train", or "test"/"valid"/"validation") of ``dataset_config.path``."""
    if kwargs:
        raise TypeError(f"get_custom_dataset got unexpected arguments {sorted(kwargs)}")
    kind = {"train": "train", "test": "test", "valid": "test", "validation": "test", "eval": "test"}.get(split)
    if kind is None:
        raise ValueError(f"split must be train/test/valid, got {split!r}")
    path = dataset_config.path
    if path == "embedded":
        from areal.embedded.corpus import make_problems

        n = dataset_config.size if dataset_config.size is not None else DEFAULT_SIZES[kind]
        rows = [normalize_row(r, i) for i, r in enumerate(make_problems(kind, n, seed=seed))]
        return EmbeddedDataset(_filter_length(rows, dataset_config, tokenizer), kind, seed)
    file = _data_file(Path(path), split, kind)
    rows = [normalize_row(r, i) for i, r in enumerate(_read_rows(file))]
    if dataset_config.size is not None:
        rows = rows[: dataset_config.size]
    rows = _filter_length(rows, dataset_config, tokenizer)
    if not rows:
        raise ValueError(f"dataset {file} ({split}) has no rows left")
    return rows


def normalize_row(row: dict[str, Any], index: int) -> dict[str, Any]:
    """One row in the common shape (see the module docstring); ``ValueError`` naming the row."""
    if not isinstance(row, dict):
        raise ValueError(f"dataset row {index} is not an object: {row!r}")
    out = dict(row)
    if "messages" in row:
        msgs = row["messages"]
        if not isinstance(msgs, list) or not msgs or not isinstance(msgs[-1], dict) or "content" not in msgs[-1]:
            raise ValueError(f"dataset row {index}: messages must be a non-empty list of {{role, content}}")
        out.setdefault("question", msgs[-1]["content"])
    else:
        question = row.get("question", row.get("prompt"))
        if not isinstance(question, str):
            raise ValueError(f"dataset row {index} needs `messages`, `question` or `prompt`; keys: {sorted(row)}")
        out["question"] = question
        out["messages"] = [{"role": "user", "content": question}]
    if "answer" not in row:
        raise ValueError(f"dataset row {index} has no `answer`; keys: {sorted(row)}")
    return out


def _data_file(path: Path, split: str, kind: str) -> Path:
    if path.is_dir():
        for name in (f"{split}.jsonl", f"{kind}.jsonl", f"{split}.json", f"{kind}.json"):
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(f"dataset directory {path} has no {split}.jsonl")
    if path.is_file():
        return path
    if "/" in str(path) and not path.suffix:
        raise FileNotFoundError(f"dataset {path} is not a local file; nothing here downloads from a hub. "
                                f"Save the split as JSONL (one {{question|messages, answer}} per line) and set path to it")
    raise FileNotFoundError(f"dataset file {path} does not exist")


def _read_rows(file: Path) -> list[dict[str, Any]]:
    text = file.read_text()
    if file.suffix == ".json":
        data = json.loads(text)
        if not isinstance(data, list):
            raise ValueError(f"{file} must hold a JSON list of rows")
        return data
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _filter_length(rows: list[dict[str, Any]], cfg: DatasetConfig, tokenizer: Any) -> list[dict[str, Any]]:
    if cfg.max_length is None:
        return rows
    if tokenizer is None:
        raise ValueError("dataset max_length needs a tokenizer to measure prompts")
    keep = []
    for row in rows:
        text = tokenizer.apply_chat_template(row["messages"], tokenize=False, add_generation_prompt=True)
        if len(tokenizer(text, add_special_tokens=False)["input_ids"]) <= cfg.max_length:
            keep.append(row)
    return keep
