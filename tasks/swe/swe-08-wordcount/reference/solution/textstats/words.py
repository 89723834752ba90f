"""Counting words."""

import re
from collections import Counter


def word_counts(text):
    """How often each word occurs, case-insensitively, punctuation ignored."""
    return Counter(re.findall(r"[a-z0-9']+", text.lower()))
