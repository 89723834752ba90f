"""URL slugs."""

import re


def slugify(text):
    """Lower-case words of ``text`` joined by single dashes, nothing else."""
    text = re.sub(r"[^a-z0-9]+", "-", text.lower())
    return text.strip("-")
