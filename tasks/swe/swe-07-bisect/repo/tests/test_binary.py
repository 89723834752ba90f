from searchkit.binary import find


def test_first():
    assert find([1, 3, 5], 1) == 0


def test_last():
    assert find([1, 3, 5], 5) == 2
