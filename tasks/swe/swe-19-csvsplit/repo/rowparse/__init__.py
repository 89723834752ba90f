"""rowparse: see fields.py."""
