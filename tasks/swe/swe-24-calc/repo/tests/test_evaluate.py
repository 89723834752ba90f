from mathexpr.evaluate import evaluate


def test_sum():
    assert evaluate("1 + 2") == 3


def test_precedence():
    assert evaluate("2+3*4") == 14
