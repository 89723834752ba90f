"""listkit: see chunks.py."""
