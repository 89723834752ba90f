"""Synthetic arithmetic word problems: the embedded model's task, its SFT corpus and its reward.

Everything here is pure Python and deterministic (``random.Random`` seeded explicitly), so the
corpus, and therefore the tokenizer and model trained on it, are a function of the source code.

Invariants:
- ``make_problems("train", ...)`` and ``make_problems("test", ...)`` never share a question: a
  question belongs to exactly one split, decided by a stable hash of its text (not by the seed).
- A problem's ``answer`` is the canonical integer (``str(int)``), never negative.
- Difficulty levels (1 easiest .. 4 hardest) come in a fixed mix, so that a briefly trained
  model solves some problems reliably, some sometimes and some rarely: GRPO needs groups whose
  samples disagree.

The SFT rendering must be exactly what RL sees: the user turn is the bare question (no system
message, no tools), and the assistant reply is one worked line plus ``\\boxed{N}``.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from dataclasses import dataclass
from typing import Any

# Share of the RL/test mix per difficulty level. Level 1: single digit. Level 2: two digit with
# one digit, or a times-table fact. Level 3: two digit with two digit, or two steps. Level 4:
# two digit times one digit (carries across positions; the tiny model rarely gets these).
LEVEL_MIX: dict[int, float] = {1: 0.3, 2: 0.35, 3: 0.25, 4: 0.1}
TEST_FRACTION_BUCKETS = 10  # one question hash bucket in ten belongs to the test split

NAMES = (
    "Ava Ben Cara Dan Eli Finn Gia Hugo Ivy Jack Kim Leo Mia Nora Omar Pia Quinn Rosa Sam Tom "
    "Uma Vic Wes Yara Zoe Anna Carl Dora Emma Fred Gina Hana Ian Jade Kai Lena Max Nina Owen Paul "
    "Ruth Sara Theo Vera Will Alex Beth Chloe David Ella Frank Grace Henry Iris James Kate Liam "
    "Maya Noah Olga Peter Rita Simon Tara Victor Wendy Xena Yusuf Zack Aria Boris Clara Diego"
).split()
OBJECTS = (
    "apples pears plums lemons oranges cherries grapes peaches melons mangoes coins stamps "
    "marbles stickers pencils crayons books cards shells stones buttons beads balloons cookies "
    "muffins candies cupcakes eggs nuts seeds flowers roses tulips leaves feathers toys blocks "
    "cars trains kites badges tickets letters photos songs puzzles rings keys cups plates spoons "
    "socks hats shirts boxes bags bottles jars nails bolts bricks tiles sheets ribbons"
).split()
CONTAINERS = "boxes bags baskets jars crates bowls shelves trays packs buckets".split()
PLACES = ("the market", "the shop", "the fair", "the park", "the library", "the garden", "school")
GAIN_VERBS = ("buys", "finds", "gets", "picks up", "is given", "wins", "collects", "makes")
LOSS_VERBS = ("gives away", "loses", "sells", "eats", "uses", "drops", "trades away", "donates")

RETRY_PROMPTS = (
    "That is not correct. Please try again.",
    "Your answer is wrong. Try again.",
    "Incorrect. Please check your work and answer again.",
    "No, that is wrong. Think again.",
)
CALCULATOR_TOOL: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * and parentheses.",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "e.g. 23*7"}},
            "required": ["expression"],
        },
    },
}
TOOL_SYSTEM_PROMPT = "You are a helpful assistant. Use the calculator tool for arithmetic."


@dataclass(frozen=True)
class Problem:
    """One word problem: text, the steps that solve it, and its difficulty level."""

    question: str
    steps: tuple[tuple[int, str, int, int], ...]  # (a, op, b, result) per worked step
    level: int

    @property
    def answer(self) -> str:
        return str(self.steps[-1][3])

    @property
    def expression(self) -> str:
        """The whole computation as one calculator expression (e.g. ``(5+3)-2``)."""
        a, op, b, _ = self.steps[0]
        expr = f"{a}{op}{b}"
        for _, op, b, _ in self.steps[1:]:
            expr = f"({expr}){op}{b}"
        return expr


def worked_solution(steps: tuple[tuple[int, str, int, int], ...]) -> str:
    """The assistant reply SFT teaches: ``5 + 3 = 8. 8 - 2 = 6. \\boxed{6}``."""
    line = " ".join(f"{a} {op} {b} = {r}." for a, op, b, r in steps)
    return f"{line} \\boxed{{{steps[-1][3]}}}"


# --- question templates: each maps (rng, numbers) to text; numbers are drawn per level ---------


def _add_question(rng: random.Random, a: int, b: int) -> str:
    name, obj = rng.choice(NAMES), rng.choice(OBJECTS)
    verb, place = rng.choice(GAIN_VERBS), rng.choice(PLACES)
    return rng.choice(
        (
            f"{name} has {a} {obj}. {name} {verb} {b} more {obj}. How many {obj} does {name} have now?",
            f"There are {a} {obj} in {place}. Then {b} more {obj} arrive. How many {obj} are there?",
            f"{name} {verb} {a} {obj} and then {b} {obj} at {place}. How many {obj} is that in total?",
            f"What is {a} plus {b}?",
        )
    )


def _sub_question(rng: random.Random, a: int, b: int) -> str:
    name, obj = rng.choice(NAMES), rng.choice(OBJECTS)
    verb, place = rng.choice(LOSS_VERBS), rng.choice(PLACES)
    return rng.choice(
        (
            f"{name} has {a} {obj}. {name} {verb} {b} of them. How many {obj} are left?",
            f"There were {a} {obj} at {place}. Then {b} were taken. How many {obj} remain?",
            f"{name} had {a} {obj} and {verb} {b}. How many {obj} does {name} have left?",
            f"What is {a} minus {b}?",
        )
    )


def _mul_question(rng: random.Random, a: int, b: int) -> str:
    name, obj, box = rng.choice(NAMES), rng.choice(OBJECTS), rng.choice(CONTAINERS)
    return rng.choice(
        (
            f"{name} has {a} {box} with {b} {obj} in each. How many {obj} are there in all?",
            f"There are {a} {box} at {rng.choice(PLACES)}. Each holds {b} {obj}. How many {obj} in total?",
            f"{name} buys {a} packs of {obj}. Each pack has {b} {obj}. How many {obj} does {name} buy?",
            f"What is {a} times {b}?",
        )
    )


def _two_step_question(rng: random.Random, a: int, b: int, c: int) -> str:
    name, obj = rng.choice(NAMES), rng.choice(OBJECTS)
    gain, loss = rng.choice(GAIN_VERBS), rng.choice(LOSS_VERBS)
    return rng.choice(
        (
            f"{name} has {a} {obj}, {gain} {b} more and then {loss} {c}. How many {obj} does {name} have?",
            f"A shelf holds {a} {obj}. {b} are added and {c} are removed. How many {obj} are on it?",
            f"What is {a} plus {b} minus {c}?",
        )
    )


def _draw(rng: random.Random, level: int) -> Problem:
    """Draw one problem of the given level."""
    r = rng.randint
    kind = rng.random()
    if level == 1:
        if kind < 0.6:
            a, b = r(1, 9), r(1, 9)
            return Problem(_add_question(rng, a, b), ((a, "+", b, a + b),), 1)
        b, c = r(1, 9), r(1, 9)
        return Problem(_sub_question(rng, b + c, b), ((b + c, "-", b, c),), 1)
    if level == 2:
        if kind < 0.35:
            a, b = r(10, 99), r(1, 9)
            return Problem(_add_question(rng, a, b), ((a, "+", b, a + b),), 2)
        if kind < 0.7:
            a, b = r(10, 99), r(1, 9)
            return Problem(_sub_question(rng, a, b), ((a, "-", b, a - b),), 2)
        a, b = r(2, 9), r(2, 9)
        return Problem(_mul_question(rng, a, b), ((a, "*", b, a * b),), 2)
    if level == 3:
        if kind < 0.35:
            a, b = r(10, 99), r(10, 99)
            return Problem(_add_question(rng, a, b), ((a, "+", b, a + b),), 3)
        if kind < 0.7:
            a, b = r(10, 99), r(10, 99)
            a, b = max(a, b), min(a, b)
            return Problem(_sub_question(rng, a, b), ((a, "-", b, a - b),), 3)
        a, b = r(2, 9), r(2, 9)
        c = r(1, a + b)
        steps = ((a, "+", b, a + b), (a + b, "-", c, a + b - c))
        return Problem(_two_step_question(rng, a, b, c), steps, 3)
    if level == 4:
        a, b = r(11, 49), r(2, 9)
        return Problem(_mul_question(rng, a, b), ((a, "*", b, a * b),), 4)
    raise ValueError(f"level must be 1..4, got {level}")


def split_of(question: str) -> str:
    """The split a question belongs to, by a stable hash of its text (independent of seeds)."""
    bucket = int.from_bytes(hashlib.sha256(question.encode()).digest()[:4], "little")
    return "test" if bucket % TEST_FRACTION_BUCKETS == 0 else "train"


def make_leveled_problems(split: str, n: int, seed: int = 0) -> list[Problem]:
    """``n`` distinct problems of ``split`` in the ``LEVEL_MIX`` proportions, deterministic."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    rng = random.Random(f"{split}:{seed}")
    levels = list(LEVEL_MIX)
    weights = [LEVEL_MIX[lv] for lv in levels]
    seen: set[str] = set()
    out: list[Problem] = []
    while len(out) < n:
        p = _draw(rng, rng.choices(levels, weights)[0])
        if p.question in seen or split_of(p.question) != split:
            continue
        seen.add(p.question)
        out.append(p)
    return out


def make_problems(split: str, n: int, seed: int = 0) -> list[dict]:
    """RL dataset rows ``{"question": str, "answer": str}``; splits never share a question."""
    return [{"question": p.question, "answer": p.answer} for p in make_leveled_problems(split, n, seed)]


# --- reward ---------------------------------------------------------------------------------

_BOXED = "\\boxed{"


def extract_boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in ``text`` (braces nest), or None if absent."""
    start = text.rfind(_BOXED)
    while start != -1:
        depth, i = 1, start + len(_BOXED)
        while i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            if depth == 0:
                return text[start + len(_BOXED) : i]
            i += 1
        # Unclosed last box (e.g. a truncated sample): fall back to an earlier, closed one.
        start = text.rfind(_BOXED, 0, start)
    return None


_NUMBER = re.compile(r"^[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?$")


def _to_number(s: str) -> float | None:
    s = s.strip().replace(",", "").strip("$ ")
    return float(s) if _NUMBER.match(s) else None


def math_reward(completion_text: str, answer: str) -> float:
    """1.0 when the last boxed value equals ``answer`` numerically ("42.0" == "42"), else 0.0."""
    boxed = extract_boxed(completion_text)
    if boxed is None:
        return 0.0
    got, want = _to_number(boxed), _to_number(answer)
    if got is None or want is None:
        return 0.0
    return 1.0 if math.isclose(got, want, rel_tol=0.0, abs_tol=1e-9) else 0.0


# --- SFT conversations ----------------------------------------------------------------------


def _wrong_steps(rng: random.Random, p: Problem) -> tuple[tuple[int, str, int, int], ...]:
    """The same steps with the last result off by a small non-zero amount (a plausible slip)."""
    a, op, b, r = p.steps[-1]
    wrong = max(0, r + rng.choice((-10, -2, -1, 1, 2, 10)))
    wrong = wrong if wrong != r else r + 1
    return p.steps[:-1] + ((a, op, b, wrong),)


def make_conversation(rng: random.Random, p: Problem, kind: str) -> dict[str, Any]:
    """One SFT sample: ``{"messages", "tools", "train_turns"}`` (indices of trained turns).

    ``kind``: "plain" (the RL rendering), "tool" (a calculator call, its response, the answer) or
    "retry" (a wrong answer, the user's complaint, the right answer; only the last is trained).
    """
    user = {"role": "user", "content": p.question}
    final = {"role": "assistant", "content": worked_solution(p.steps)}
    if kind == "plain":
        return {"messages": [user, final], "tools": None, "train_turns": [1]}
    if kind == "tool":
        call = {
            "type": "function",
            "function": {"name": "calculator", "arguments": {"expression": p.expression}},
        }
        return {
            "messages": [
                {"role": "system", "content": TOOL_SYSTEM_PROMPT},
                user,
                {"role": "assistant", "content": "", "tool_calls": [call]},
                {"role": "tool", "name": "calculator", "content": p.answer},
                final,
            ],
            "tools": [CALCULATOR_TOOL],
            "train_turns": [2, 4],
        }
    if kind == "retry":
        wrong = {"role": "assistant", "content": worked_solution(_wrong_steps(rng, p))}
        retry = {"role": "user", "content": rng.choice(RETRY_PROMPTS)}
        return {"messages": [user, wrong, retry, final], "tools": None, "train_turns": [3]}
    raise ValueError(f"kind must be plain/tool/retry, got {kind!r}")


def make_sft_conversations(n: int, seed: int, tool_share: float, retry_share: float) -> list[dict[str, Any]]:
    """``n`` SFT conversations over train-split problems, in the given mix of kinds."""
    rng = random.Random(f"sft:{seed}")
    problems = make_leveled_problems("train", n, seed=10_000 + seed)
    out = []
    for p in problems:
        x = rng.random()
        kind = "tool" if x < tool_share else "retry" if x < tool_share + retry_share else "plain"
        out.append(make_conversation(rng, p, kind))
    return out
