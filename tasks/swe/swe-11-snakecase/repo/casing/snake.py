"""camelCase and PascalCase to snake_case."""

import re


def to_snake(name):
    """``name`` in snake_case; a run of capitals (an acronym) is one word."""
    return re.sub(r"(?<!^)([A-Z])", r"_\1", name).lower()
