from spans.merge import merge_intervals


def test_unsorted():
    assert merge_intervals([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]


def test_chain_touching():
    assert merge_intervals([(3, 4), (1, 2), (2, 3)]) == [(1, 4)]


def test_contained():
    assert merge_intervals([(1, 10), (2, 3)]) == [(1, 10)]
