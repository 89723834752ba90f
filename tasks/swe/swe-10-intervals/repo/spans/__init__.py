"""spans: see merge.py."""
