from calendarkit.years import days_in_month, is_leap


def test_2024():
    assert is_leap(2024)


def test_1900():
    assert not is_leap(1900)


def test_february():
    assert days_in_month(2023, 2) == 28
