from textkit.slug import slugify


def test_digits():
    assert slugify("Top 10 Tips") == "top-10-tips"


def test_only_symbols():
    assert slugify("!!!") == ""


def test_already_slug():
    assert slugify("a-b-c") == "a-b-c"
