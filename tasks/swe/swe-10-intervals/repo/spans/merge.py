"""Merging closed intervals."""


def merge_intervals(intervals):
    """The union of closed intervals (start, end), as sorted disjoint intervals."""
    out = []
    for start, end in sorted(intervals):
        if out and start < out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out
