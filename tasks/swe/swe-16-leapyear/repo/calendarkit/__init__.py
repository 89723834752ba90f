"""calendarkit: see years.py."""
