"""Binary search."""


def find(items, x):
    """The index of ``x`` in the sorted ``items``, or -1."""
    lo, hi = 0, len(items) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if items[mid] == x:
            return mid
        if items[mid] < x:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
