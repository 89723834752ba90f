import pytest
from statkit.center import median


def test_even_unsorted():
    assert median([10, 2, 8, 4]) == 6


def test_single():
    assert median([7]) == 7


def test_empty():
    with pytest.raises(ValueError):
        median([])
