"""Splitting one CSV line into fields."""


def split_fields(line):
    """The comma-separated fields of ``line``; a double-quoted field may hold commas ("" is a quote)."""
    return line.split(",")
