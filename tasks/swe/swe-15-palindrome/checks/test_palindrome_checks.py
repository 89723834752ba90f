from wordplay.palindrome import is_palindrome


def test_not():
    assert not is_palindrome("palindrome")


def test_mixed_case():
    assert is_palindrome("RaceCar")


def test_digits():
    assert is_palindrome("12 3 21")
