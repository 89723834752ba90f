from versions.semver import compare, parse


def test_parse():
    assert parse("2.0.11") == (2, 0, 11)


def test_older():
    assert compare("0.9.9", "0.10.0") == -1


def test_sort():
    import functools

    found = sorted(["1.10.0", "1.2.0", "1.9.3"], key=functools.cmp_to_key(compare))
    assert found == ["1.2.0", "1.9.3", "1.10.0"]
