from graphs.paths import shortest_path


def test_no_path():
    assert shortest_path({"a": ["b"]}, "a", "z") is None


def test_line():
    assert shortest_path({"a": ["b"], "b": ["c"]}, "a", "c") == ["a", "b", "c"]
