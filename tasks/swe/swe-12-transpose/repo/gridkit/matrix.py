"""Small matrices as lists of rows."""


def transpose(rows):
    """The transpose of a rectangular matrix given as a list of rows."""
    if not rows:
        return []
    return [[rows[i][j] for i in range(len(rows))] for j in range(len(rows))]


def identity(n):
    return [[int(i == j) for j in range(n)] for i in range(n)]
