from rowparse.fields import split_fields


def test_escaped_quote():
    assert split_fields('"say ""hi""",x') == ['say "hi"', "x"]


def test_empty_fields():
    assert split_fields(",,") == ["", "", ""]


def test_quoted_empty():
    assert split_fields('"",a') == ["", "a"]
