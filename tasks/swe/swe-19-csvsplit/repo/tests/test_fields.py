from rowparse.fields import split_fields


def test_plain():
    assert split_fields("a,b,c") == ["a", "b", "c"]


def test_quoted_comma():
    assert split_fields('a,"b,c",d') == ["a", "b,c", "d"]
