"""Human-readable byte counts (binary units)."""

UNITS = ["B", "KiB", "MiB", "GiB", "TiB"]


def format_size(n):
    """``n`` bytes as '123 B', '1.5 KiB', '2.0 MiB', ..."""
    if n < 0:
        raise ValueError("negative size")
    value, unit = float(n), 0
    while value >= 1024 and unit < len(UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{int(value)} B" if unit == 0 else f"{value:.1f} {UNITS[unit]}"
