"""nested: see flat.py."""
