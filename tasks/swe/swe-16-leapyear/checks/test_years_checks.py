from calendarkit.years import days_in_month, is_leap


def test_2000():
    assert is_leap(2000)


def test_2100():
    assert not is_leap(2100)


def test_feb_1900():
    assert days_in_month(1900, 2) == 28
