"""Palindromes."""


def is_palindrome(text):
    """Whether ``text`` reads the same backwards, looking only at letters and digits, ignoring case."""
    kept = list(text)
    return kept == kept[::-1]
