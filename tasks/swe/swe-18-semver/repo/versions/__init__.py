"""versions: see semver.py."""
