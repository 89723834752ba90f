"""Math-answer verification: is a model's final answer the reference answer, as a number or expression?

``math_equal`` asks the ``math-verify`` package first (the verifier AReaL and most RL recipes
use); what follows is this module's own, dependency-free verifier, the fallback where the
package is missing or reads no answer.

    completion ──extract_answer──► "\\frac{1}{2}" ──to_sympy──► Rational(1, 2) ─┐
    reference  ──extract_answer──► "0.5"          ──to_sympy──► Float(0.5)     ─┴─► equal?

Extraction, in order: the last ``\\boxed{...}`` (braces nest), GSM8K's ``#### N``, "the answer
is X", then the last number in the text. Normalisation removes what does not change a value:
``$``, ``\\!``, ``\\,``, ``\\left``/``\\right``, ``\\text{...}`` units, ``^\\circ``, a trailing
period, and thousands separators ("1,000" is 1000; "1,5" is not a number). Equality: exact
after normalisation, else numeric (relative 1e-6) when both sides evaluate to numbers, else
``sympy.simplify(a - b) == 0`` for expressions with symbols.

Arithmetic left undone is not an answer: when the reference is a number, a final answer that is
numbers joined by ``+ - * \\times \\cdot`` (``72 - 3``, ``\\boxed{2 \\times 3}``) scores False
whatever its value, from the package and the fallback alike. Both would otherwise evaluate it,
and a policy trained on the calculator agent learned to stop calling the tool and write the
expression (benchmarks/README.md, credit section). A fraction (``3/4``, ``\\frac{3}{4}``), a
sign, a root or a symbolic answer is still an answer.

Covered: integers, decimals, signs, scientific notation, percentages (``50\\%`` == ``50``),
``a/b``, ``\\frac``/``\\dfrac``/``\\tfrac`` (also ``\\frac12``), ``\\sqrt``, ``\\pi``,
``\\cdot``/``\\times``, ``^``, implicit multiplication (``2x``), simple symbolic expressions.
Not covered: sets, intervals, tuples, matrices, equations (``x = 3`` compares the right side
only), units conversion. sympy can be slow on adversarial input: run this through
``AsyncRewardWrapper`` (a process pool with a timeout) inside a rollout loop.

Importing this module imports ``math-verify`` (when installed) and verifies one answer with it and
with the fallback: their parsers, grammars and sympy's caches are built on first use (~50 ms of
CPU in this process, once). A process forked after the import, as every sandboxed episode is from
its zygote, which imports the agent's module before forking, then starts with them built: a
reward computed in an episode costs ~4 ms of CPU rather than ~100 ms (benchmarks/e2e.py).
"""

from __future__ import annotations

import math
import re
import threading
from tokenize import TokenError

import sympy
from sympy.parsing.sympy_parser import implicit_multiplication_application, parse_expr, standard_transformations

from areal.embedded.corpus import extract_boxed

_ANSWER_IS = re.compile(r"answer is[:\s]*\$?([^\n$]+?)\$?\s*(?:\.\s|\.?$)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:[eE][+-]?\d+)?|-?\.\d+")
_THOUSANDS = re.compile(r"^[+-]?\d{1,3}(,\d{3})+(\.\d+)?$")
_TRANSFORMS = standard_transformations + (implicit_multiplication_application,)
_MAX_LEN = 200  # longer "answers" are not short final answers; refuse to feed them to sympy
_OPERAND = r"[+-]?(?:\d[\d,]*(?:\.\d+)?|\.\d+)"
_UNDONE = re.compile(rf"{_OPERAND}(?:\s*(?:[+\-*×]|\\times|\\cdot)\s*{_OPERAND})+")


def extract_answer(text: str) -> str | None:
    """The final answer a completion states, or None when it states none."""
    boxed = extract_boxed(text)
    if boxed is not None:
        return boxed
    if "####" in text:
        return text.rsplit("####", 1)[1].strip()
    m = _ANSWER_IS.findall(text)
    if m:
        return m[-1].strip()
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def normalize(ans: str) -> str:
    """Strip formatting that never changes the value (see the module docstring)."""
    s = ans.strip()
    s = re.sub(r"\\text\{[^}]*\}", "", s)  # units: "5 \text{ apples}"
    s = re.sub(r"\\(?:mathrm|mathbf|textbf)\{([^}]*)\}", r"\1", s)
    for token in ("\\left", "\\right", "\\!", "\\,", "\\;", "\\:", "\\displaystyle", "$", "^\\circ", "^{\\circ}", "\\%", "%"):
        s = s.replace(token, "")
    s = s.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    if "=" in s:  # "x = 3": the value is the right-hand side
        s = s.rsplit("=", 1)[1]
    s = s.strip().rstrip(".").strip()
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s.replace(" ", "")


def to_sympy(ans: str) -> sympy.Expr | None:
    """A normalised answer as a sympy expression, or None if it does not parse as one."""
    if not ans or len(ans) > _MAX_LEN or "," in ans:
        return None
    s = re.sub(r"\\frac(\d)(\d)", r"\\frac{\1}{\2}", ans)  # \frac12
    s = re.sub(r"\\sqrt(\d+)", r"\\sqrt{\1}", s)
    for _ in range(8):  # \frac{a}{b} nests: rewrite innermost-first until none is left
        new = re.sub(r"\\frac\{([^{}]*)\}\{([^{}]*)\}", r"((\1)/(\2))", s)
        new = re.sub(r"\\sqrt\{([^{}]*)\}", r"sqrt(\1)", new)
        if new == s:
            break
        s = new
    s = s.replace("\\cdot", "*").replace("\\times", "*").replace("\\pi", "pi").replace("^", "**")
    s = s.replace("{", "(").replace("}", ")")
    if "\\" in s or not re.fullmatch(r"[\w\s.+\-*/()]*", s):
        return None
    try:
        return parse_expr(s, transformations=_TRANSFORMS, evaluate=True)
    except (SyntaxError, TypeError, ValueError, ZeroDivisionError, sympy.SympifyError, TokenError):
        return None


def answers_equal(pred: str, ref: str) -> bool:
    """True when two final answers denote the same value (see the module docstring)."""
    a, b = normalize(pred), normalize(ref)
    if not a or not b:
        return False
    if a == b:
        return True
    x, y = to_sympy(a), to_sympy(b)
    if x is None or y is None:
        return False
    if x.is_number and y.is_number:
        xv, yv = complex(x.evalf()), complex(y.evalf())
        return math.isclose(xv.real, yv.real, rel_tol=1e-6, abs_tol=1e-9) and math.isclose(xv.imag, yv.imag, abs_tol=1e-9)
    return sympy.simplify(x - y) == 0


def math_equal(completion: str, reference: str) -> bool:
    """Does ``completion``'s final answer equal ``reference``'s (itself extracted if it is a
    worked solution, e.g. GSM8K's ``... #### 72``)? Judged by the ``math-verify`` package where it
    is installed and can read both sides (LaTeX and plain expressions, sets, intervals, units...),
    else by this module's own extraction and comparison."""
    ref = extract_answer(reference) if ("####" in reference or "\\boxed" in reference) else reference
    if ref is None:
        return False
    numeric_ref = _NUMBER.fullmatch(normalize(ref)) is not None
    verdict, read = _package_verdict(completion, ref)
    if verdict is not None:
        return verdict and not (numeric_ref and undone_arithmetic(read))
    pred = extract_answer(completion)
    return pred is not None and answers_equal(pred, ref) and not (numeric_ref and undone_arithmetic(pred))


def undone_arithmetic(answer: str) -> bool:
    """True when ``answer`` is numbers joined by + - * \\times \\cdot: arithmetic left for the grader."""
    return _UNDONE.fullmatch(answer.strip().strip("$").strip().rstrip(".").strip()) is not None


def _package_verdict(completion: str, reference: str) -> tuple[bool | None, str]:
    """``math-verify``'s verdict and the completion's answer as it read it, or (None, "") when it
    is not installed or reads no answer on a side.
    Its timeouts use SIGALRM, which only the main thread may set: off it they are off (as AReaL
    runs it in workers), and the caller bounds the time instead (``AsyncRewardWrapper``)."""
    try:
        import math_verify
    except ImportError:
        return None, ""
    timeout = 5 if threading.current_thread() is threading.main_thread() else None
    gold = math_verify.parse(f"\\boxed{{{reference}}}", parsing_timeout=timeout)  # a bare answer, read as one
    pred = math_verify.parse(completion, parsing_timeout=timeout)
    if not gold or not pred:
        return None, ""
    return bool(math_verify.verify(gold, pred, timeout_seconds=timeout)), str(pred[-1])


def _warm_up() -> None:
    """Build the verifiers' lazy state now, in the importing process (see the module docstring)."""
    try:
        import math_verify  # noqa: F401  -- imported here, so that forks of this process hold it
    except ImportError:
        pass
    math_equal("so the answer is \\boxed{\\frac{1}{2}}", "0.5")
    answers_equal("1/2", "x/2")
    # parts of sympy that it imports at their first use, reached by a root and by a tuple: imported
    # here, or every episode whose answer reaches them imports them again (the sandbox's preload hint)
    math_equal("\\boxed{\\sqrt{2}}", "42")
    math_equal("\\boxed{(1,2)}", "42")


_warm_up()
