"""Evaluating arithmetic expressions with + - * / and parentheses."""

import re

TOKEN = re.compile(r"\s*(?:(\d+(?:\.\d+)?)|(.))")


def tokens(text):
    out = []
    for number, op in TOKEN.findall(text):
        out.append(float(number) if number else op)
    return out


def evaluate(text):
    """The value of ``text``, with the usual precedence."""
    items = tokens(text)
    pos = 0

    def peek():
        return items[pos] if pos < len(items) else None

    def take():
        nonlocal pos
        pos += 1
        return items[pos - 1]

    def atom():
        tok = take()
        if tok == "(":
            value = expr()
            take()
            return value
        if tok == "-":
            return -atom()
        return tok

    def expr():
        value = atom()
        while peek() in ("+", "-", "*", "/"):
            op = take()
            right = atom()
            value = {"+": value + right, "-": value - right, "*": value * right}.get(op, value / right if right else 0)
        return value

    return expr()
