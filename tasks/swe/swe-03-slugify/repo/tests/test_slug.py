from textkit.slug import slugify


def test_simple():
    assert slugify("hello") == "hello"


def test_words():
    assert slugify("  Hello,   World!  ") == "hello-world"
