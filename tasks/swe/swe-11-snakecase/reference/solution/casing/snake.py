"""camelCase and PascalCase to snake_case."""

import re


def to_snake(name):
    """``name`` in snake_case; a run of capitals (an acronym) is one word."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\1_\2", name)
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return name.lower()
