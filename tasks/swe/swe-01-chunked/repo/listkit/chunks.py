"""Splitting sequences into fixed-size pieces."""


def chunked(items, size):
    """The items in lists of ``size`` (the last one shorter when they do not divide evenly)."""
    if size < 1:
        raise ValueError("size must be >= 1")
    return [list(items[i : i + size]) for i in range(0, len(items) - size + 1, size)]
