"""Palindromes."""


def is_palindrome(text):
    """Whether ``text`` reads the same backwards, looking only at letters and digits, ignoring case."""
    kept = [c.lower() for c in text if c.isalnum()]
    return kept == kept[::-1]
