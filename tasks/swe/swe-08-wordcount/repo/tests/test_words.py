from textstats.words import word_counts


def test_plain():
    assert word_counts("a b a")["a"] == 2


def test_case_and_punctuation():
    counts = word_counts("The end. the END!")
    assert counts["the"] == 2 and counts["end"] == 2
