"""wordplay: see palindrome.py."""
