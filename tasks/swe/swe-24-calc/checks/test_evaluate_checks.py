from mathexpr.evaluate import evaluate


def test_parentheses():
    assert evaluate("(2+3)*4") == 20


def test_division_first():
    assert evaluate("10 - 6 / 2") == 7


def test_negative():
    assert evaluate("-3 * -2 + 1") == 7
