import pytest
from listkit.chunks import chunked


def test_size_larger_than_items():
    assert chunked([1, 2], 5) == [[1, 2]]


def test_empty():
    assert chunked([], 3) == []


def test_string():
    assert chunked("abcdefg", 3) == [["a", "b", "c"], ["d", "e", "f"], ["g"]]


def test_bad_size():
    with pytest.raises(ValueError):
        chunked([1], 0)
