"""``math_equal``: the ``math-verify`` package decides where it can read both sides (it knows
sets, intervals and LaTeX this project's own verifier does not), the hand-written verifier is the
fallback without it, and both work off the main thread (the package's SIGALRM timeouts cannot)."""

from __future__ import annotations

import concurrent.futures
import sys

import pytest
from paths import ROOT

from areal.reward.math_verify import math_equal

CASES = [
    ("so the answer is \\boxed{42}.", "42", True),
    ("The answer is 1,000", "1000", True),
    ("\\boxed{\\frac{1}{2}}", "0.5", True),
    ("I think 7", "8", False),
    ("the answer is $\\frac{\\sqrt{8}}{2}$", "\\sqrt{2}", True),
    ("Natalia sold 48 clips. #### 72", "... #### 72", True),
]


@pytest.mark.parametrize("completion,reference,equal", CASES)
def test_common_answers_are_judged_alike_with_and_without_the_package(completion, reference, equal, monkeypatch):
    assert math_equal(completion, reference) is equal
    monkeypatch.setitem(sys.modules, "math_verify", None)  # import fails: the fallback decides
    assert math_equal(completion, reference) is equal


UNDONE = [
    ("72 - 3 = }", "69", False),  # what a policy trained on the calculator agent learned to write
    ("so it is \\boxed{2 \\times 3}", "6", False),
    ("\\boxed{3 - 4}", "-1", False),
    ("\\boxed{2 \\cdot 3}", "#### 6", False),
    ("The answer is 5 + 3 = 8", "8", True),  # the stated result, after the working
    ("The answer is 3/4", "0.75", True),  # a fraction is an answer
    ("\\boxed{-3}", "-3", True),
    ("\\boxed{x+1}", "x+1", True),  # the reference is not a number: symbolic answers compare
]


@pytest.mark.parametrize("completion,reference,equal", UNDONE)
def test_arithmetic_left_undone_is_not_a_numeric_answer(completion, reference, equal, monkeypatch):
    assert math_equal(completion, reference) is equal
    monkeypatch.setitem(sys.modules, "math_verify", None)
    assert math_equal(completion, reference) is equal


def test_the_package_decides_what_the_fallback_cannot_read(monkeypatch):
    assert math_equal("\\boxed{\\{1,2\\}}", "\\{2,1\\}")  # a set: order does not matter
    monkeypatch.setitem(sys.modules, "math_verify", None)
    assert not math_equal("\\boxed{\\{1,2\\}}", "\\{2,1\\}")


def test_it_runs_off_the_main_thread():
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda case: math_equal(case[0], case[1]), CASES))
    assert results == [equal for _, _, equal in CASES]


def test_a_process_forked_after_the_import_verifies_without_importing_anything():
    """What a sandboxed episode (a fork of the zygote, which imported the agent's modules) needs
    to score an answer is imported by the import of this module: ``math-verify`` and its parsers
    too, and the parts of sympy it imports lazily, not on the episode's first call (each fork would
    import them again)."""

    code = """
import os, sys
from areal.reward.gsm8k import gsm8k_reward_fn
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    before = set(sys.modules)
    # a root and a tuple reach parts of sympy that it imports at their first use
    answers = ("so 6*7 = 42, the answer is \\\\boxed{42}", "\\\\boxed{\\\\sqrt{2}}", "\\\\boxed{(1,2)}")
    score = [gsm8k_reward_fn(completions=a, answer="#### 42") for a in answers]
    new = sorted(set(sys.modules) - before)
    os.write(w, f"{score} {new}".encode())
    os._exit(0)
os.waitpid(pid, 0)
print(os.read(r, 1 << 16).decode())
"""
    import subprocess

    root = str(ROOT)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=root)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[1.0, 0.0, 0.0] []", done.stdout
