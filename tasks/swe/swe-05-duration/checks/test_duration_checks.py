import pytest
from timefmt.duration import parse_duration


def test_all_units():
    assert parse_duration("1h1m1s") == 3661


def test_minutes():
    assert parse_duration("45m") == 2700


def test_bad():
    with pytest.raises(ValueError):
        parse_duration("soon")
