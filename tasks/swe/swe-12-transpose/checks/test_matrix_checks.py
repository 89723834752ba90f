from gridkit.matrix import transpose


def test_tall():
    assert transpose([[1], [2], [3]]) == [[1, 2, 3]]


def test_empty():
    assert transpose([]) == []


def test_twice():
    m = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert transpose(transpose(m)) == m
