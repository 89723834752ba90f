"""gridkit: see matrix.py."""
