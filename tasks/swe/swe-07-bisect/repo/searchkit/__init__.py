"""searchkit: see binary.py."""
