from confkit.merge import deep_merge


def test_flat():
    assert deep_merge({"a": 1}, {"b": 2}) == {"a": 1, "b": 2}


def test_nested():
    merged = deep_merge({"db": {"host": "x", "port": 1}}, {"db": {"port": 2}})
    assert merged == {"db": {"host": "x", "port": 2}}
