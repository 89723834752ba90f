"""reasoning-gym's procedural tasks as dataset rows: the spec that names them, the rows, the split.

    data.train=reasoning-gym:chain_sum@2/max_terms:3+leg_counting+fraction_simplification
        │ parse_spec: [TaskSpec(name, weight, config)], syntax only (no import)
        ▼
    task_rows(spec, split, size, seed)
        │ one reasoning_gym CompositeDataset of the tasks (per-task configs; its members seeded from
        │ the run's seed (train) or seed + HELD_OUT_SEED_OFFSET (held-out), as it seeds them); each
        │ task gets its share of ``size`` (task_quotas: largest remainder of its weight), its
        │ member's entries drawn in index order, each kept only when its question lies on the
        │ split's side; the tasks interleaved in their shares
        ▼
    rows {question, messages: [system, user], answer, metadata, task, task_config}
        │                                  (areal/dataset.py: load_rows, get_custom_dataset)
        ▼
    the run's reward: areal/reward/reasoning_gym.py calls the task's own scorer (``scorer``) on the
    reply's last <answer>...</answer>, with the row's entry (question, answer, metadata)

The spec (one string, no ``=`` or ``,``: Hydra takes it unquoted on the command line)::

    reasoning-gym:TASK[@WEIGHT][/KEY:VALUE]...[+TASK[@WEIGHT][/KEY:VALUE]...]...

``TASK`` is a reasoning-gym dataset name (``reasoning_gym.factory.DATASETS``); ``WEIGHT`` its
share of the mix (a positive number, default 1: each split holds the tasks in exactly these
proportions, rounded, rather than a random draw of a task per row as the composite's own
``__getitem__`` makes, so a small held-out set still scores every task); ``KEY:VALUE`` sets a
field of that task's config (its difficulty: ``min_terms``, ``max_digits``, ...); a VALUE is
read as an integer, a number, ``true``/``false``, else a word.
``size`` and ``seed`` are not set here: ``data.train_size`` / ``data.eval_size`` (AReaL's
``train_dataset.size``) and the run's ``seed`` are.

Invariants:
- Train and held-out rows never share a question. Each question lies on one side, decided by a
  hash of its text (``held_out_side``: one bucket in HELD_OUT_BUCKETS is held-out), whatever the
  seed, sizes or mix; the train rows keep only train-side questions, the held-out rows only
  held-out-side ones. Either split is made on its own (AReaL's scripts load them apart), so the
  guarantee cannot rest on comparing one with the other. The held-out rows are also drawn from
  another seed (seed + HELD_OUT_SEED_OFFSET): reasoning-gym's generators seed entry ``i`` with
  ``seed + i``, so a nearby seed would replay the train entries shifted by a few indices. One
  bucket in four, not a smaller share: the held-out side draws ~4 entries per row it keeps.
- Rows depend only on (spec, split, size, seed): a resumed run, a test or a script regenerates them.
- A row keeps the generator's entry as it made it (``metadata`` not copied through JSON), so the
  scorer sees what it would see inside reasoning-gym (some scorers compare tuples).
- ``messages`` is reasoning-gym's own convention: its default system prompt (think, then the
  bare answer in <answer></answer> tags), then the question as the user turn; ``question`` is
  the generator's question unchanged.

What is not covered: list-valued config fields (``styles`` of fraction_simplification, ...) are
not expressible in the spec; a task with very few distinct questions may not fill a split (an
error names it); rows are generated at the start, all of them (a slow generator, such as
knight_swap at ~2 s an entry, makes a slow start).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import hashlib
import json
import math
from typing import Any

PREFIX = "reasoning-gym:"
HELD_OUT_BUCKETS = 4  # one question-hash bucket in four is held-out (the rest: train)
HELD_OUT_SEED_OFFSET = 1_000_003  # the held-out composite's seed: the run's seed + this
INSTALL = "pip install 'areal-lite[envs]' (or pip install reasoning-gym==0.1.25; make installs it from requirements.lock)"
RESERVED = ("size", "seed")  # set by the run (data.*_size, seed), never by the spec


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """One task of a spec: its reasoning-gym name, its weight in the mix, its config overrides."""

    name: str
    weight: float = 1.0
    config: dict[str, Any] = dataclasses.field(default_factory=dict)


def is_task_spec(path: str) -> bool:
    """Whether a data path (data.train, train_dataset.path) names reasoning-gym tasks."""
    return path.startswith(PREFIX)


def parse_spec(spec: str) -> list[TaskSpec]:
    """The tasks of ``spec`` (module docstring), checked for syntax: a ``ValueError`` naming the
    part that is wrong. Task and config names are checked against reasoning-gym by ``check_tasks``."""
    if not is_task_spec(spec):
        raise ValueError(f"a reasoning-gym spec starts with {PREFIX!r}, got {spec!r}")
    body = spec[len(PREFIX) :]
    if not body:
        raise ValueError(f"{spec!r} names no task: write {PREFIX}TASK[@WEIGHT][/KEY:VALUE]...[+TASK...]")
    tasks: list[TaskSpec] = []
    for part in body.split("+"):
        head, *options = part.split("/")
        name, at, weight_text = head.partition("@")
        if not name:
            raise ValueError(f"{spec!r}: an empty task name in {part!r} (tasks are joined by '+')")
        weight = 1.0
        if at:
            try:
                weight = float(weight_text)
            except ValueError:
                weight = math.nan
            if not (math.isfinite(weight) and weight > 0):
                raise ValueError(f"{spec!r}: the weight of {name!r} must be a positive number (TASK@WEIGHT), got {weight_text!r}")
        config: dict[str, Any] = {}
        for option in options:
            key, colon, value = option.partition(":")
            if not key or not colon or not value:
                raise ValueError(f"{spec!r}: {name!r} has the option {option!r}; write /KEY:VALUE (e.g. /max_terms:3)")
            if key in RESERVED:
                raise ValueError(
                    f"{spec!r}: {name!r} sets {key!r}, which the run sets: sizes are data.train_size / data.eval_size "
                    "(AReaL: train_dataset.size), the seed is the run's seed"
                )
            if key in config:
                raise ValueError(f"{spec!r}: {name!r} sets {key!r} twice")
            config[key] = _value(value)
        if any(t.name == name for t in tasks):
            raise ValueError(f"{spec!r} names {name!r} twice: give it once, with its weight (TASK@WEIGHT)")
        tasks.append(TaskSpec(name, weight, config))
    return tasks


def _value(text: str) -> Any:
    """A config value as written: an integer, a number, true/false, else the word itself."""
    if text in ("true", "false"):
        return text == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def import_reasoning_gym() -> Any:
    """The reasoning_gym package, or an ``ImportError`` saying how to install it."""
    try:
        import reasoning_gym  # deferred: ~100 generators to import, only a run on these tasks needs them
    except ImportError as e:
        raise ImportError(f"reasoning-gym tasks need the reasoning_gym package, which is not installed: {INSTALL}") from e
    return reasoning_gym


def check_tasks(tasks: list[TaskSpec]) -> None:
    """Each task exists in reasoning-gym and each config key is a field of its config: else a
    ``ValueError`` naming the close task names, or the task's config fields."""
    import_reasoning_gym()
    from reasoning_gym.factory import DATASETS

    known = sorted(n for n in DATASETS if n != "composite")
    for t in tasks:
        if t.name not in known:
            close = difflib.get_close_matches(t.name, known, n=5, cutoff=0.6)
            hint = f"close names: {', '.join(close)}" if close else f"the {len(known)} tasks: {', '.join(known)}"
            raise ValueError(f"unknown reasoning-gym task {t.name!r}; {hint}")
        fields = [f.name for f in dataclasses.fields(DATASETS[t.name][1]) if f.name not in RESERVED]
        unknown = sorted(set(t.config) - set(fields))
        if unknown:
            raise ValueError(
                f"reasoning-gym task {t.name!r} has no config field {', '.join(map(repr, unknown))}; its fields: {', '.join(fields)}"
            )


def held_out_side(question: str) -> bool:
    """Whether ``question`` belongs to the held-out side (a stable hash of its text, no seed)."""
    return int.from_bytes(hashlib.sha256(question.encode()).digest()[:4], "little") % HELD_OUT_BUCKETS == 0


def task_rows(spec: str, split: str, size: int, seed: int) -> list[dict[str, Any]]:
    """``size`` rows of ``spec``'s mix for ``split`` ("train", or "test": held-out), made with
    ``seed`` (module docstring: which seed, which side), each task its share. Deterministic."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test' (held-out), got {split!r}")
    tasks = parse_spec(spec)
    check_tasks(tasks)
    from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec

    held_out = split == "test"
    quotas = task_quotas([t.weight for t in tasks], size)
    draws = 10 * max(quotas) + 1000  # per task; the train side takes 3 entries in 4, the held-out side 1 in 4: ample
    specs = [DatasetSpec(t.name, t.weight, dict(t.config)) for t in tasks]
    try:  # the tasks' own checks of their configs (reasoning-gym asserts)
        mix = CompositeDataset(CompositeConfig(size=draws, seed=seed + HELD_OUT_SEED_OFFSET if held_out else seed, datasets=specs))
    except (AssertionError, TypeError, ValueError) as e:
        raise ValueError(f"{spec!r}: reasoning-gym refused the config: {e!r}") from e
    placed: list[tuple[float, int, dict[str, Any]]] = []  # (position in the mix, task order, row)
    for order, (t, quota) in enumerate(zip(tasks, quotas)):
        member, found = mix.datasets[t.name], 0
        for index in range(draws):
            if found == quota:
                break
            entry = member[index]
            if held_out_side(entry["question"]) == held_out:
                placed.append(((found + 0.5) / quota, order, _row(entry, t.config)))
                found += 1
        if found < quota:
            side = "held-out" if held_out else "train"
            raise ValueError(
                f"{spec!r}: only {found} of {quota} {side} problems of {t.name!r} after {draws} draws (its questions seldom "
                "fall on that side: a task with few distinct questions); ask for fewer (data.train_size / data.eval_size) "
                "or mix in another task"
            )
    return [row for _, _, row in sorted(placed, key=lambda p: p[:2])]  # the tasks interleaved in their shares


def task_quotas(weights: list[float], size: int) -> list[int]:
    """Rows per task: ``size`` split in proportion to ``weights`` by largest remainder (ties: the
    earlier task), so every split holds each task in its exact share, not a random draw of it."""
    shares = [size * w / sum(weights) for w in weights]
    quotas = [int(s) for s in shares]
    for i in sorted(range(len(shares)), key=lambda i: quotas[i] - shares[i])[: size - sum(quotas)]:
        quotas[i] += 1
    return quotas


def _row(entry: dict[str, Any], config: dict[str, Any]) -> dict[str, Any]:
    """A reasoning-gym entry as a dataset row (module docstring)."""
    from reasoning_gym.utils import SYSTEM_PROMPTS

    return {
        "question": entry["question"],
        "messages": [{"role": "system", "content": SYSTEM_PROMPTS["default"]}, {"role": "user", "content": entry["question"]}],
        "answer": entry["answer"],
        "metadata": entry["metadata"],
        "task": entry["metadata"]["source_dataset"],
        "task_config": dict(config),
    }


def is_task_row(row: dict[str, Any]) -> bool:
    """Whether ``row`` is a reasoning-gym entry as ``task_rows`` makes it (its scorer can score it)."""
    metadata = row.get("metadata")
    return isinstance(metadata, dict) and "source_dataset" in metadata and isinstance(row.get("task_config"), dict)


def scorer(task: str, config: dict[str, Any]) -> Any:
    """The ``score_answer(answer, entry)`` of ``task`` built with ``config`` (the overrides its rows
    were generated with), as reasoning-gym's composite routes an entry to it."""
    return _scorer(task, json.dumps(config, sort_keys=True))


@functools.lru_cache(maxsize=256)
def _scorer(task: str, config_json: str) -> Any:
    # Built once per (task, config): some generators load word lists or puzzles when made.
    return import_reasoning_gym().create_dataset(task, **json.loads(config_json)).score_answer
