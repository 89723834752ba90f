"""numerals: see roman.py."""
