"""The embedded task's calculator tool (``corpus.CALCULATOR_TOOL``): what every calculator agent
executes, and what the agentic variant's SFT mix quotes as the tool's answers.

``calculator(expression)`` is evaluated over the AST with + - * / and parentheses only; anything
else is an error string the model sees as the tool's answer (a bad call is the policy's mistake,
not a crash).
"""

from __future__ import annotations

import ast
import json
import operator

_OPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.USub: operator.neg,
    ast.UAdd: operator.pos,
}
_MAX_EXPR = 200


def calculator(expression: str) -> str:
    """The value of an arithmetic expression, or ``error: ...``."""
    if not isinstance(expression, str) or len(expression) > _MAX_EXPR:
        return "error: expression must be a short string"
    try:
        value = _eval(ast.parse(expression.replace("×", "*"), mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError) as e:
        return f"error: {e}"
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _eval(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.left), _eval(node.right))
    if isinstance(node, ast.UnaryOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_eval(node.operand))
    raise ValueError(f"unsupported expression element {type(node).__name__}")


def execute_tool_call(name: str, arguments: str) -> str:
    """The calculator's answer to one call, or an ``error: ...`` string the model sees: a bad call
    is the policy's mistake, scored by the final answer, not a crash."""
    if name != "calculator":
        return f"error: unknown tool {name!r}"
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as e:
        return f"error: arguments are not JSON ({e})"
    if not isinstance(args, dict):
        return "error: arguments must be a JSON object"
    return calculator(args.get("expression", ""))
