"""humanize: see sizes.py."""
