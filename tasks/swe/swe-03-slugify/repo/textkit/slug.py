"""URL slugs."""

import re


def slugify(text):
    """Lower-case words of ``text`` joined by single dashes, nothing else."""
    return re.sub(r"[^a-z0-9]", "-", text.lower())
