from casing.snake import to_snake


def test_inner_acronym():
    assert to_snake("getHTTPResponseCode") == "get_http_response_code"


def test_pascal():
    assert to_snake("PascalCase") == "pascal_case"


def test_digits():
    assert to_snake("version2Update") == "version2_update"
