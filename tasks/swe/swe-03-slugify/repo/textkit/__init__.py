"""textkit: see slug.py."""
