"""codec: see rle.py."""
