from nested.flat import flatten


def test_numbers():
    assert flatten([1, [2, [3]]]) == [1, 2, 3]


def test_generators():
    assert flatten([range(3), (i for i in [3])]) == [0, 1, 2, 3]
