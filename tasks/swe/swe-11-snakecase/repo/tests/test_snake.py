from casing.snake import to_snake


def test_camel():
    assert to_snake("camelCase") == "camel_case"


def test_acronym():
    assert to_snake("HTTPServer") == "http_server"
