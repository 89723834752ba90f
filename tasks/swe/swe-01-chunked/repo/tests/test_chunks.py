from listkit.chunks import chunked


def test_even():
    assert chunked([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]


def test_remainder():
    assert chunked([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
