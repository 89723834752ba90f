from humanize.sizes import format_size


def test_bytes():
    assert format_size(512) == "512 B"


def test_one_kib():
    assert format_size(1024) == "1.0 KiB"
