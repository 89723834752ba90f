"""The calculator tool server (its own process: verifiers runs ``python -m vf_calculator.tools``)."""

import ast
import operator

import verifiers.v1 as vf

RESULT_PREFIX = "calculator result:"  # what the tool's replies start with: the test finds it in the next prompt
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def _value(node: ast.AST) -> float:
    if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)):
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_value(node.left), _value(node.right))
    raise ValueError("only numbers and + - * /")


class CalculatorTools(vf.Toolset[vf.SharedToolsetConfig]):
    TOOL_PREFIX = None  # the tool keeps its own name: calculator

    @vf.tool
    async def calculator(self, expression: str) -> str:
        """Evaluate an arithmetic expression of numbers and + - * /."""
        try:
            value = _value(ast.parse(expression, mode="eval").body)
        except (SyntaxError, ValueError, ZeroDivisionError) as e:
            return f"{RESULT_PREFIX} error: {e}"
        return f"{RESULT_PREFIX} {value:g}"


if __name__ == "__main__":
    CalculatorTools.run()
