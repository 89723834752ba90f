"""``get_custom_dataset(split, dataset_config, tokenizer)``: AReaL's dataset loader, for RL prompts.

Rows come back as plain dicts in one shape, whatever the source::

    {"messages": [{"role": "user", "content": q}], "question": q, "answer": a, ...other keys}

``messages`` is what AReaL's agents read (``data["messages"][-1]["content"]``), ``question``
what this project's agents read; both are always present.

Sources (``dataset_config.path``):
- ``"embedded"``: the built-in arithmetic word problems (``areal.embedded.corpus``), train/test
  splits that never share a question. The result is an ``EmbeddedDataset`` (a list) that
  remembers split, size and seed, so the trainer can hand the controller its own task.
- a ``.jsonl`` / ``.json`` / ``.parquet`` file, a directory holding ``<split>.jsonl`` (or
  ``.json`` / ``.parquet``), or an HF ``datasets`` folder (``save_to_disk`` of a ``Dataset`` or of
  a ``DatasetDict``, whose ``split`` is taken): rows with ``messages``, ``question`` or
  ``prompt``, and ``answer`` (GSM8K's raw rows work as they are), or other columns named by a
  field mapping (``load_rows(prompt_key=..., answer_key=...)``; the main CLI's ``data.*``).
- ``"reasoning-gym:TASK[@WEIGHT][/KEY:VALUE]...[+TASK...]"``: reasoning-gym's procedural tasks, a
  task or a weighted mix, generated (``size`` rows, the run's ``seed``) with their entries
  (``metadata``, ``task``, ``task_config``) for the task's own scorer; train and held-out rows
  never share a question (areal/tasks/reasoning_gym.py).
- ``"verifiers:[ENV+]TASKSET"``: a verifiers taskset's own tasks (its ``load()``, in the verifiers
  venv: areal/agent/verifiers_env.py ``taskset_rows``), ``size`` of them from task ``offset`` on,
  each with its TaskData (``verifiers_task``) for ``rollout.agent=verifiers:...``; the run's held-out
  rows are the tasks after the training ones (areal/controller/problems.py).
- ``"swe:DIR"``: a library of repository bug-fix tasks with a world (one row per task directory,
  naming it in ``world``: the sandbox gives each episode a private copy of its repository and
  grades it; areal/tasks/swe.py, sandbox/world.py), in the order of their directories' names, ``size``
  of them from task ``offset`` on; the run's held-out rows are the tasks after the training ones
  (none when those take every task) unless ``data.eval`` names other tasks.
Hub names (``openai/gsm8k``) are refused: nothing here downloads; save the split to disk.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from areal.agent.verifiers_env import is_taskset_spec, taskset_rows
from areal.tasks import swe
from areal.tasks.reasoning_gym import is_task_spec, task_rows

DEFAULT_SIZES = {"train": 4000, "test": 500}
# a split's name -> the side of a generated task it reads (the embedded task's, reasoning-gym's)
SPLIT_KINDS = {"train": "train", "test": "test", "valid": "test", "validation": "test", "eval": "test"}


@dataclass
class DatasetConfig:
    """A dataset (``train_dataset`` / ``valid_dataset``); see ``areal.dataset.get_custom_dataset``."""

    # "embedded" (the built-in arithmetic task), a .jsonl/.json file, a dir of <split>.jsonl, or
    # "reasoning-gym:TASK[@WEIGHT][/KEY:VALUE]...[+TASK...]" (reasoning-gym's tasks, generated)
    path: str = "embedded"
    type: str = "rl"
    batch_size: int = 8  # prompts per training step
    shuffle: bool = True
    max_length: int | None = None  # drop prompts longer than this many tokens
    size: int | None = None  # rows to take (a generated task: rows to generate; default 4000 train / 500 test)

    def __post_init__(self) -> None:
        if self.type != "rl":
            raise ValueError(f"dataset type must be 'rl' (the only kind this system trains on), got {self.type!r}")
        if self.batch_size < 1:
            raise ValueError(f"dataset batch_size must be >= 1, got {self.batch_size}")
        if self.size is not None and self.size < 0:
            raise ValueError(f"dataset size must be >= 0, got {self.size}")


class EmbeddedDataset(list):
    """Rows of the embedded task, with how they were made (``split``, ``seed``)."""

    def __init__(self, rows: list[dict[str, Any]], split: str, seed: int) -> None:
        super().__init__(rows)
        self.split = split
        self.seed = seed


def get_custom_dataset(
    split: str, dataset_config: DatasetConfig, tokenizer: Any = None, seed: int = 1, **kwargs: Any
) -> list[dict[str, Any]]:
    """The rows of ``split`` ("train", or "test"/"valid"/"validation") of ``dataset_config.path``."""
    if kwargs:
        raise TypeError(f"get_custom_dataset got unexpected arguments {sorted(kwargs)}")
    kind = SPLIT_KINDS.get(split)
    if kind is None:
        raise ValueError(f"split must be train/test/valid, got {split!r}")
    path = dataset_config.path
    n = dataset_config.size if dataset_config.size is not None else DEFAULT_SIZES[kind]
    if path == "embedded":
        from areal.embedded.corpus import make_problems

        rows = [normalize_row(r, i) for i, r in enumerate(make_problems(kind, n, seed=seed))]
        return EmbeddedDataset(_filter_length(rows, dataset_config, tokenizer), kind, seed)
    if is_task_spec(path) or swe.is_swe_spec(path):
        rows = _filter_length(load_rows(path, split, size=n, seed=seed), dataset_config, tokenizer)
        if not rows:
            raise ValueError(f"dataset {path} ({split}) has no rows left (max_length={dataset_config.max_length})")
        return rows
    file = Path(path) if _is_hf_folder(Path(path)) else _data_file(Path(path), split, kind)
    rows = load_rows(str(file), split)
    if dataset_config.size is not None:
        rows = rows[: dataset_config.size]
    rows = _filter_length(rows, dataset_config, tokenizer)
    if not rows:
        raise ValueError(f"dataset {file} ({split}) has no rows left")
    return rows


def load_rows(
    path: str,
    split: str = "train",
    prompt_key: str = "",
    answer_key: str = "answer",
    *,
    size: int | None = None,
    seed: int = 1,
    offset: int = 0,
) -> list[dict[str, Any]]:
    """Every row of a data file or folder (module docstring), in the common shape.

    ``prompt_key``: the column holding the prompt (a string) or the conversation (a list of
    ``{role, content}``); empty: ``messages``, else ``question``, else ``prompt``. ``answer_key``:
    the column holding the reference answer. Other columns stay in each row (the agent's ``data``
    and the reward function's keyword arguments). Errors name the file and the row.

    A reasoning-gym spec is generated instead: ``size`` rows (default: 4000 train, 500 held-out)
    of ``split``'s side (train, or test/valid/validation/eval: held-out) with ``seed``; it has no
    columns to map. A verifiers taskset's rows are its tasks from ``offset`` on, ``size`` of them
    (default as above; fewer when the taskset ends first).
    """
    if is_task_spec(path):
        kind = SPLIT_KINDS.get(split)
        if kind is None:
            raise ValueError(f"{path}: a generated task's split is train or test (held-out: test/valid/validation/eval), got {split!r}")
        if prompt_key or answer_key != "answer":
            raise ValueError(
                f"{path}: generated rows have question/messages and answer; data.prompt_key / data.answer_key name a file's columns"
            )
        n = size if size is not None else DEFAULT_SIZES[kind]
        return [normalize_row(r, i) for i, r in enumerate(task_rows(path, kind, n, seed))]
    if is_taskset_spec(path):
        if SPLIT_KINDS.get(split) is None or prompt_key or answer_key != "answer":
            raise ValueError(f"{path}: a taskset's rows are its tasks: no split other than train/test, no data.prompt_key / answer_key")
        rows = taskset_rows(path, size if size is not None else DEFAULT_SIZES[SPLIT_KINDS[split]], offset)
        if not rows:
            raise ValueError(
                f"{path}: its taskset has no task from task {offset} on"
                + (" (held-out rows are the tasks after the training ones: lower data.train_size)" if offset else "")
            )
        return [normalize_row(r, i) for i, r in enumerate(rows)]
    if swe.is_swe_spec(path):
        if prompt_key or answer_key != "answer":
            raise ValueError(f"{path}: task rows have question/messages; data.prompt_key / data.answer_key name a file's columns")
        rows = [normalize_row(r, i) for i, r in enumerate(swe.task_rows(path))][offset:]  # none past the last task
        return rows[:size] if size is not None else rows
    source = Path(path)
    if _is_hf_folder(source):
        raw = _read_hf_folder(source, split)
    elif source.is_dir():
        raw = _read_rows(_data_file(source, split, split))
    elif source.is_file():
        raw = _read_rows(source)
    else:
        _data_file(source, split, split)  # raises, naming what is wrong
        raw = []
    rows = []
    for i, row in enumerate(raw):
        if isinstance(row, dict) and (prompt_key or answer_key != "answer"):
            row = _map_fields(row, i, prompt_key, answer_key, path)
        try:
            rows.append(normalize_row(row, i))
        except ValueError as e:
            raise ValueError(f"{path}: {e}") from None
    if not rows:
        raise ValueError(f"dataset {path} ({split}) has no rows")
    return rows


def _map_fields(row: dict[str, Any], index: int, prompt_key: str, answer_key: str, path: str) -> dict[str, Any]:
    out = dict(row)
    if prompt_key:
        if prompt_key not in row:
            raise ValueError(f"{path}: row {index} has no column {prompt_key!r} (data.prompt_key); columns: {sorted(row)}")
        value = out.pop(prompt_key)
        out.pop("messages", None)
        out["messages" if isinstance(value, list) else "question"] = value
    if answer_key != "answer":
        if answer_key not in row:
            raise ValueError(f"{path}: row {index} has no column {answer_key!r} (data.answer_key); columns: {sorted(row)}")
        out["answer"] = out.pop(answer_key)
    return out


def _is_hf_folder(path: Path) -> bool:
    """A folder written by ``Dataset.save_to_disk`` or ``DatasetDict.save_to_disk``."""
    return path.is_dir() and ((path / "dataset_dict.json").is_file() or (path / "state.json").is_file())


def _read_hf_folder(path: Path, split: str) -> list[dict[str, Any]]:
    from datasets import DatasetDict, load_from_disk  # deferred: pyarrow is heavy, and only this path needs it

    data = load_from_disk(str(path))
    if isinstance(data, DatasetDict):
        if split not in data:
            raise ValueError(f"dataset folder {path} has splits {sorted(data)}, not {split!r}")
        data = data[split]
    return data.to_list()


def normalize_row(row: dict[str, Any], index: int, need_answer: bool = True) -> dict[str, Any]:
    """One row in the common shape (see the module docstring); ``ValueError`` naming the row.
    ``need_answer=False``: a row without ``answer`` is kept as it is (a workflow object scores its
    rows itself, from whatever fields they carry: AReaL's boba rows hold ``solutions``), and so is
    one without a prompt field (the workflow builds its prompt itself)."""
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
        if not isinstance(question, str) and not need_answer:
            return out  # its own fields only (AReaL's countdown rows: an already templated `query`, `numbers`, `target`)
        if not isinstance(question, str):
            raise ValueError(f"dataset row {index} needs `messages`, `question` or `prompt`; keys: {sorted(row)}")
        out["question"] = question
        out["messages"] = [{"role": "user", "content": question}]
    if need_answer and "answer" not in row:
        raise ValueError(f"dataset row {index} has no `answer`; keys: {sorted(row)}")
    return out


def _data_file(path: Path, split: str, kind: str) -> Path:
    if path.is_dir():
        for name in (f"{split}.jsonl", f"{kind}.jsonl", f"{split}.json", f"{kind}.json", f"{split}.parquet", f"{kind}.parquet"):
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(f"dataset directory {path} has no {split}.jsonl")
    if path.is_file():
        return path
    if "/" in str(path) and not path.suffix:
        raise FileNotFoundError(
            f"dataset {path} is not a local file; nothing here downloads from a hub. "
            f"Save the split as JSONL (one {{question|messages, answer}} per line) and set path to it"
        )
    raise FileNotFoundError(f"dataset file {path} does not exist")


def _read_rows(file: Path) -> list[dict[str, Any]]:
    if file.suffix == ".parquet":
        import pyarrow.parquet as pq  # deferred: only parquet needs it

        return pq.read_table(file).to_pylist()
    if file.suffix not in (".json", ".jsonl"):
        raise ValueError(f"dataset file {file}: use .jsonl, .json or .parquet, or a `datasets` save_to_disk folder")
    text = file.read_text()
    if file.suffix == ".json":
        data = json.loads(text)
        if not isinstance(data, list):
            raise ValueError(f"{file} must hold a JSON list of rows")
        return data
    rows = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as e:
                raise ValueError(f"{file}, line {n}: not JSON ({e})") from None
    return rows


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


def stratified_order(levels: list[int], block: int, seed: int) -> list[int]:
    """Problem indices ordered so that every ``block`` consecutive prompts (one step's groups)
    mix the difficulty levels in the same proportions as the whole set.

    Without this, the mean reward of a step mostly measures how many hard prompts it drew, and a
    reward curve is noise around the policy's real progress.
    """
    rng = random.Random(seed)
    by_level: dict[int, list[int]] = {}
    for i, lv in enumerate(levels):
        by_level.setdefault(lv, []).append(i)
    for idx in by_level.values():
        rng.shuffle(idx)
    # Per block, each level gets its share by largest remainder; the same allocation every block.
    shares = {lv: len(idx) / len(levels) * block for lv, idx in by_level.items()}
    counts = {lv: int(s) for lv, s in shares.items()}
    for lv in sorted(shares, key=lambda lv: shares[lv] - counts[lv], reverse=True)[: block - sum(counts.values())]:
        counts[lv] += 1
    order: list[int] = []
    cursor = dict.fromkeys(by_level, 0)
    while len(order) < len(levels):
        chunk = []
        for lv, c in sorted(counts.items()):
            for _ in range(c):
                chunk.append(by_level[lv][cursor[lv] % len(by_level[lv])])
                cursor[lv] += 1
        rng.shuffle(chunk)
        order.extend(chunk)
    return order
