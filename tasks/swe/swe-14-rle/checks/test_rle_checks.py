from codec.rle import rle_decode, rle_encode


def test_round_trip():
    for text in ["", "a", "abc", "zzzzzy", "aabbaa"]:
        assert rle_decode(rle_encode(text)) == text


def test_single_run():
    assert rle_encode("xxxx") == [("x", 4)]
