"""cachekit: see lru.py."""
