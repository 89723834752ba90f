from nested.flat import flatten


def test_bytes_whole():
    assert flatten([b"xy", (b"z",)]) == [b"xy", b"z"]


def test_strings_whole():
    assert flatten(["ab", ["cd"]]) == ["ab", "cd"]


def test_nested_set():
    assert flatten([[{5}], (range(1, 3),)]) == [5, 1, 2]


def test_empty_lists():
    assert flatten([[], [[]], 1]) == [1]
