import pytest
from humanize.sizes import format_size


def test_one_mib():
    assert format_size(1048576) == "1.0 MiB"


def test_fraction():
    assert format_size(1536) == "1.5 KiB"


def test_negative():
    with pytest.raises(ValueError):
        format_size(-1)
