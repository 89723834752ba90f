"""Measures of the center of a sample."""


def mean(values):
    if not values:
        raise ValueError("mean of an empty sample")
    return sum(values) / len(values)


def median(values):
    """The middle value of the sorted sample; the mean of the two middle ones for an even count."""
    if not values:
        raise ValueError("median of an empty sample")
    ordered = sorted(values)
    mid = len(ordered) // 2
    return ordered[mid]
