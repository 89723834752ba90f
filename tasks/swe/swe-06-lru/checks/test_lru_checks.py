from cachekit.lru import LRUCache


def test_capacity_kept():
    c = LRUCache(3)
    for i in range(10):
        c.put(i, i)
    assert len(c) == 3


def test_newest_survive():
    c = LRUCache(2)
    for k in "abc":
        c.put(k, k)
    assert c.get("c") == "c" and c.get("b") == "b" and c.get("a") is None


def test_update_refreshes():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("a", 10)
    c.put("c", 3)
    assert c.get("a") == 10 and c.get("b") is None
