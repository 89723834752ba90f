from units.temperature import celsius_to_fahrenheit, fahrenheit_to_celsius


def test_c_to_f():
    assert celsius_to_fahrenheit(100) == 212


def test_f_to_c():
    assert fahrenheit_to_celsius(212) == 100
