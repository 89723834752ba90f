import pytest
from numerals.roman import to_roman


def test_1994():
    assert to_roman(1994) == "MCMXCIV"


def test_2024():
    assert to_roman(2024) == "MMXXIV"


def test_range():
    with pytest.raises(ValueError):
        to_roman(0)
