import pytest
from units.temperature import celsius_to_fahrenheit, fahrenheit_to_celsius


def test_freezing():
    assert fahrenheit_to_celsius(32) == 0


def test_minus_forty():
    assert fahrenheit_to_celsius(-40) == -40


def test_round_trip():
    assert fahrenheit_to_celsius(celsius_to_fahrenheit(37.5)) == pytest.approx(37.5)
