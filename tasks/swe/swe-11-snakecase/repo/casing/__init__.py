"""casing: see snake.py."""
