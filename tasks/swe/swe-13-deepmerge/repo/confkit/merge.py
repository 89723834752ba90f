"""Merging configuration dictionaries."""


def deep_merge(base, override):
    """A new dict: ``base`` updated by ``override``, nested dicts merged key by key."""
    out = dict(base)
    for key, value in override.items():
        out[key] = value
    return out
