"""textstats: see words.py."""
