"""Roman numerals."""

SYMBOLS = [
    (1000, "M"),
    (500, "D"),
    (100, "C"),
    (50, "L"),
    (10, "X"),
    (5, "V"),
    (1, "I"),
]


def to_roman(n):
    """``n`` (1..3999) as a Roman numeral."""
    if not 0 < n < 4000:
        raise ValueError("out of range")
    out = []
    for value, symbol in SYMBOLS:
        while n >= value:
            out.append(symbol)
            n -= value
    return "".join(out)
