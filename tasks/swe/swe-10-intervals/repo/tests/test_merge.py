from spans.merge import merge_intervals


def test_overlap():
    assert merge_intervals([(1, 3), (2, 4)]) == [(1, 4)]


def test_touching():
    assert merge_intervals([(1, 2), (2, 3)]) == [(1, 3)]
