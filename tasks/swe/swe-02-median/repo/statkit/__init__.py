"""statkit: see center.py."""
