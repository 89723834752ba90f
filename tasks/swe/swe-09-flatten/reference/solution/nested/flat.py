"""Flattening nested iterables."""


def flatten(items):
    """Every leaf of nested lists, tuples and other iterables, in order; strings and bytes are leaves."""
    out = []
    for item in items:
        if isinstance(item, (str, bytes)) or not hasattr(item, "__iter__"):
            out.append(item)
        else:
            out.extend(flatten(item))
    return out
