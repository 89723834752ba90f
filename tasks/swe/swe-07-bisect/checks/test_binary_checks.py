from searchkit.binary import find


def test_missing():
    assert find([1, 3, 5], 4) == -1


def test_single():
    assert find([7], 7) == 0


def test_empty():
    assert find([], 1) == -1


def test_every_position():
    items = list(range(0, 40, 2))
    assert [find(items, x) for x in items] == list(range(20))
