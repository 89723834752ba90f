from codec.rle import rle_decode, rle_encode


def test_decode():
    assert rle_decode([("a", 2), ("b", 1)]) == "aab"


def test_encode():
    assert rle_encode("aaabcc") == [("a", 3), ("b", 1), ("c", 2)]
