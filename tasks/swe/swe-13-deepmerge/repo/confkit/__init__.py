"""confkit: see merge.py."""
