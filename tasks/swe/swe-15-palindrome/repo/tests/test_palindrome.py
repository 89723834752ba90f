from wordplay.palindrome import is_palindrome


def test_word():
    assert is_palindrome("level")


def test_sentence():
    assert is_palindrome("A man, a plan, a canal: Panama")
