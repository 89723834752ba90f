"""mathexpr: see evaluate.py."""
