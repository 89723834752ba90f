"""units: see temperature.py."""
