from textstats.words import word_counts


def test_apostrophe_kept():
    assert word_counts("don't stop, don't")["don't"] == 2


def test_empty():
    assert word_counts("") == {}


def test_total():
    assert sum(word_counts("One, two; THREE... one").values()) == 4
