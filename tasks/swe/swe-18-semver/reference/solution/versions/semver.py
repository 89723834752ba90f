"""Comparing dotted version numbers (MAJOR.MINOR.PATCH)."""


def parse(version):
    return tuple(int(part) for part in version.split("."))


def compare(a, b):
    """-1, 0 or 1 as version ``a`` is older than, the same as, or newer than ``b``."""
    pa, pb = parse(a), parse(b)
    return (pa > pb) - (pa < pb)
