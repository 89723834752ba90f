from graphs.paths import shortest_path


def test_start_is_goal():
    assert shortest_path({}, "a", "a") == ["a"]


def test_shortest_of_two():
    g = {"a": ["b", "d"], "b": ["c"], "c": ["e"], "d": ["e"]}
    assert shortest_path(g, "a", "e") == ["a", "d", "e"]


def test_cycle():
    g = {"a": ["b"], "b": ["a", "c"], "c": []}
    assert shortest_path(g, "a", "c") == ["a", "b", "c"]
