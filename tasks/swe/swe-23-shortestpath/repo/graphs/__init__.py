"""graphs: see paths.py."""
