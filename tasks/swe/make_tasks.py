"""Writes the shipped library of repository bug-fix tasks (docs/swe-tasks.md: the format) and checks each.

    python tasks/swe/make_tasks.py [--check-only]

Each task is a tiny Python package with one bug: ``repo/`` (the package, its README and its visible
tests, where at least one test fails), ``checks/`` (the grader's hidden tests), ``reference/solution/``
(the fixed module: the reference solution, mounted read-only in the grader only) and
``task.json``. Made from ``TASKS`` below: the correct module, and the bug as a (correct, buggy)
pair of snippets replaced once. Every task is checked with pytest on this host (not sandboxed: the
code is this file's): on the buggy repository at least one check fails, with the reference
solution every check passes.

Past 800 lines because it holds the 24 tasks' text (module, bug, tests and checks of each, side by
side); the code is the ~100 lines at the end. This file lives inside the library on purpose: the library is masked in its tasks' episodes
(sandbox/world.py), so neither the checks nor this source of them is in an agent's view.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

HERE = os.path.dirname(os.path.abspath(__file__))


@dataclass(frozen=True)
class Spec:
    id: str
    package: str
    module: str
    prompt: str
    source: str  # the correct module
    bug: tuple[str, str]  # (correct snippet, buggy snippet), replaced once in ``source``
    tests: str  # the visible tests (repo/tests/test_<module>.py)
    checks: str  # the hidden checks (checks/test_<module>_checks.py)


TASKS = [
    Spec(
        "swe-01-chunked",
        "listkit",
        "chunks",
        "chunked(items, size) loses the last chunk when len(items) is not a multiple of size: "
        "chunked([1, 2, 3, 4, 5], 2) gives [[1, 2], [3, 4]] instead of [[1, 2], [3, 4], [5]].",
        '''"""Splitting sequences into fixed-size pieces."""


def chunked(items, size):
    """The items in lists of ``size`` (the last one shorter when they do not divide evenly)."""
    if size < 1:
        raise ValueError("size must be >= 1")
    return [list(items[i : i + size]) for i in range(0, len(items), size)]
''',
        ("range(0, len(items), size)", "range(0, len(items) - size + 1, size)"),
        """from listkit.chunks import chunked


def test_even():
    assert chunked([1, 2, 3, 4], 2) == [[1, 2], [3, 4]]


def test_remainder():
    assert chunked([1, 2, 3, 4, 5], 2) == [[1, 2], [3, 4], [5]]
""",
        """import pytest
from listkit.chunks import chunked


def test_size_larger_than_items():
    assert chunked([1, 2], 5) == [[1, 2]]


def test_empty():
    assert chunked([], 3) == []


def test_string():
    assert chunked("abcdefg", 3) == [["a", "b", "c"], ["d", "e", "f"], ["g"]]


def test_bad_size():
    with pytest.raises(ValueError):
        chunked([1], 0)
""",
    ),
    Spec(
        "swe-02-median",
        "statkit",
        "center",
        "median() is wrong for lists of even length: median([1, 2, 3, 4]) returns 3, it should be 2.5 (the mean of the two middle values).",
        '''"""Measures of the center of a sample."""


def mean(values):
    if not values:
        raise ValueError("mean of an empty sample")
    return sum(values) / len(values)


def median(values):
    """The middle value of the sorted sample; the mean of the two middle ones for an even count."""
    if not values:
        raise ValueError("median of an empty sample")
    ordered = sorted(values)
    mid = len(ordered) // 2
    if len(ordered) % 2:
        return ordered[mid]
    return (ordered[mid - 1] + ordered[mid]) / 2
''',
        (
            "    if len(ordered) % 2:\n        return ordered[mid]\n    return (ordered[mid - 1] + ordered[mid]) / 2\n",
            "    return ordered[mid]\n",
        ),
        """from statkit.center import mean, median


def test_mean():
    assert mean([1, 2, 3]) == 2


def test_median_odd():
    assert median([3, 1, 2]) == 2


def test_median_even():
    assert median([1, 2, 3, 4]) == 2.5
""",
        """import pytest
from statkit.center import median


def test_even_unsorted():
    assert median([10, 2, 8, 4]) == 6


def test_single():
    assert median([7]) == 7


def test_empty():
    with pytest.raises(ValueError):
        median([])
""",
    ),
    Spec(
        "swe-03-slugify",
        "textkit",
        "slug",
        "slugify() leaves runs of dashes and dashes at the ends: slugify('  Hello,   World!  ') gives "
        "'-hello-world-' style output; it should give 'hello-world'.",
        '''"""URL slugs."""

import re


def slugify(text):
    """Lower-case words of ``text`` joined by single dashes, nothing else."""
    text = re.sub(r"[^a-z0-9]+", "-", text.lower())
    return text.strip("-")
''',
        (
            '    text = re.sub(r"[^a-z0-9]+", "-", text.lower())\n    return text.strip("-")\n',
            '    return re.sub(r"[^a-z0-9]", "-", text.lower())\n',
        ),
        """from textkit.slug import slugify


def test_simple():
    assert slugify("hello") == "hello"


def test_words():
    assert slugify("  Hello,   World!  ") == "hello-world"
""",
        """from textkit.slug import slugify


def test_digits():
    assert slugify("Top 10 Tips") == "top-10-tips"


def test_only_symbols():
    assert slugify("!!!") == ""


def test_already_slug():
    assert slugify("a-b-c") == "a-b-c"
""",
    ),
    Spec(
        "swe-04-roman",
        "numerals",
        "roman",
        "to_roman() writes 4 as 'IIII' and 9 as 'VIIII'; standard numerals use subtraction: 4 is 'IV', 9 is 'IX', "
        "40 is 'XL', 90 is 'XC', 400 is 'CD', 900 is 'CM'.",
        '''"""Roman numerals."""

SYMBOLS = [
    (1000, "M"),
    (900, "CM"),
    (500, "D"),
    (400, "CD"),
    (100, "C"),
    (90, "XC"),
    (50, "L"),
    (40, "XL"),
    (10, "X"),
    (9, "IX"),
    (5, "V"),
    (4, "IV"),
    (1, "I"),
]


def to_roman(n):
    """``n`` (1..3999) as a Roman numeral."""
    if not 0 < n < 4000:
        raise ValueError("out of range")
    out = []
    for value, symbol in SYMBOLS:
        while n >= value:
            out.append(symbol)
            n -= value
    return "".join(out)
''',
        (
            '    (1000, "M"),\n    (900, "CM"),\n    (500, "D"),\n    (400, "CD"),\n    (100, "C"),\n    (90, "XC"),\n    (50, "L"),\n'
            '    (40, "XL"),\n    (10, "X"),\n    (9, "IX"),\n    (5, "V"),\n    (4, "IV"),\n    (1, "I"),\n',
            '    (1000, "M"),\n    (500, "D"),\n    (100, "C"),\n    (50, "L"),\n    (10, "X"),\n    (5, "V"),\n    (1, "I"),\n',
        ),
        """from numerals.roman import to_roman


def test_simple():
    assert to_roman(3) == "III"


def test_four():
    assert to_roman(4) == "IV"
""",
        """import pytest
from numerals.roman import to_roman


def test_1994():
    assert to_roman(1994) == "MCMXCIV"


def test_2024():
    assert to_roman(2024) == "MMXXIV"


def test_range():
    with pytest.raises(ValueError):
        to_roman(0)
""",
    ),
    Spec(
        "swe-05-duration",
        "timefmt",
        "duration",
        "parse_duration('1h30m') returns 27000 seconds; it should be 5400. Minutes are counted wrong.",
        '''"""Durations written as 1h30m15s."""

import re

UNITS = {"h": 3600, "m": 60, "s": 1}


def parse_duration(text):
    """Seconds in a duration like ``2h``, ``45m``, ``1h30m15s``."""
    parts = re.fullmatch(r"(?:(\\d+)h)?(?:(\\d+)m)?(?:(\\d+)s)?", text.strip())
    if not text.strip() or parts is None:
        raise ValueError(f"not a duration: {text!r}")
    return sum(int(n) * UNITS[u] for n, u in zip(parts.groups(), "hms") if n)
''',
        ('UNITS = {"h": 3600, "m": 60, "s": 1}', 'UNITS = {"h": 3600, "m": 360, "s": 1}'),
        """from timefmt.duration import parse_duration


def test_hours():
    assert parse_duration("2h") == 7200


def test_hours_minutes():
    assert parse_duration("1h30m") == 5400
""",
        """import pytest
from timefmt.duration import parse_duration


def test_all_units():
    assert parse_duration("1h1m1s") == 3661


def test_minutes():
    assert parse_duration("45m") == 2700


def test_bad():
    with pytest.raises(ValueError):
        parse_duration("soon")
""",
    ),
    Spec(
        "swe-06-lru",
        "cachekit",
        "lru",
        "LRUCache evicts the wrong entry: after get('a') the entry 'a' was just used, yet putting a new key "
        "into a full cache evicts 'a' instead of the least recently used entry.",
        '''"""A least-recently-used cache."""

from collections import OrderedDict


class LRUCache:
    def __init__(self, capacity):
        if capacity < 1:
            raise ValueError("capacity must be >= 1")
        self.capacity = capacity
        self.data = OrderedDict()

    def get(self, key, default=None):
        if key not in self.data:
            return default
        self.data.move_to_end(key)
        return self.data[key]

    def put(self, key, value):
        self.data[key] = value
        self.data.move_to_end(key)
        if len(self.data) > self.capacity:
            self.data.popitem(last=False)

    def __len__(self):
        return len(self.data)
''',
        ("            self.data.popitem(last=False)\n", "            self.data.popitem(last=True)\n"),
        """from cachekit.lru import LRUCache


def test_get_put():
    c = LRUCache(2)
    c.put("a", 1)
    assert c.get("a") == 1


def test_evicts_least_recent():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.get("a")
    c.put("c", 3)
    assert c.get("b") is None and c.get("a") == 1
""",
        """from cachekit.lru import LRUCache


def test_capacity_kept():
    c = LRUCache(3)
    for i in range(10):
        c.put(i, i)
    assert len(c) == 3


def test_newest_survive():
    c = LRUCache(2)
    for k in "abc":
        c.put(k, k)
    assert c.get("c") == "c" and c.get("b") == "b" and c.get("a") is None


def test_update_refreshes():
    c = LRUCache(2)
    c.put("a", 1)
    c.put("b", 2)
    c.put("a", 10)
    c.put("c", 3)
    assert c.get("a") == 10 and c.get("b") is None
""",
    ),
    Spec(
        "swe-07-bisect",
        "searchkit",
        "binary",
        "find(sorted_items, x) returns -1 for the last element of the list: find([1, 3, 5], 5) should be 2.",
        '''"""Binary search."""


def find(items, x):
    """The index of ``x`` in the sorted ``items``, or -1."""
    lo, hi = 0, len(items) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        if items[mid] == x:
            return mid
        if items[mid] < x:
            lo = mid + 1
        else:
            hi = mid - 1
    return -1
''',
        ("    while lo <= hi:\n", "    while lo < hi:\n"),
        """from searchkit.binary import find


def test_first():
    assert find([1, 3, 5], 1) == 0


def test_last():
    assert find([1, 3, 5], 5) == 2
""",
        """from searchkit.binary import find


def test_missing():
    assert find([1, 3, 5], 4) == -1


def test_single():
    assert find([7], 7) == 0


def test_empty():
    assert find([], 1) == -1


def test_every_position():
    items = list(range(0, 40, 2))
    assert [find(items, x) for x in items] == list(range(20))
""",
    ),
    Spec(
        "swe-08-wordcount",
        "textstats",
        "words",
        "word_counts() counts 'The' and 'the' as different words and keeps punctuation ('end.' vs 'end'); "
        "it should be case-insensitive and ignore punctuation around words.",
        '''"""Counting words."""

import re
from collections import Counter


def word_counts(text):
    """How often each word occurs, case-insensitively, punctuation ignored."""
    return Counter(re.findall(r"[a-z0-9']+", text.lower()))
''',
        ('    return Counter(re.findall(r"[a-z0-9\']+", text.lower()))\n', '    return Counter(re.findall(r"\\S+", text))\n'),
        """from textstats.words import word_counts


def test_plain():
    assert word_counts("a b a")["a"] == 2


def test_case_and_punctuation():
    counts = word_counts("The end. the END!")
    assert counts["the"] == 2 and counts["end"] == 2
""",
        """from textstats.words import word_counts


def test_apostrophe_kept():
    assert word_counts("don't stop, don't")["don't"] == 2


def test_empty():
    assert word_counts("") == {}


def test_total():
    assert sum(word_counts("One, two; THREE... one").values()) == 4
""",
    ),
    Spec(
        "swe-09-flatten",
        "nested",
        "flat",
        "flatten() only flattens lists and tuples: flatten([range(3), (i for i in [3])]) should be [0, 1, 2, 3]. "
        "Every iterable (ranges, generators, sets, ...) must be flattened, except strings and bytes, which are kept whole.",
        '''"""Flattening nested iterables."""


def flatten(items):
    """Every leaf of nested lists, tuples and other iterables, in order; strings and bytes are leaves."""
    out = []
    for item in items:
        if isinstance(item, (str, bytes)) or not hasattr(item, "__iter__"):
            out.append(item)
        else:
            out.extend(flatten(item))
    return out
''',
        (
            '        if isinstance(item, (str, bytes)) or not hasattr(item, "__iter__"):\n',
            "        if not isinstance(item, (list, tuple)):\n",
        ),
        """from nested.flat import flatten


def test_numbers():
    assert flatten([1, [2, [3]]]) == [1, 2, 3]


def test_generators():
    assert flatten([range(3), (i for i in [3])]) == [0, 1, 2, 3]
""",
        """from nested.flat import flatten


def test_bytes_whole():
    assert flatten([b"xy", (b"z",)]) == [b"xy", b"z"]


def test_strings_whole():
    assert flatten(["ab", ["cd"]]) == ["ab", "cd"]


def test_nested_set():
    assert flatten([[{5}], (range(1, 3),)]) == [5, 1, 2]


def test_empty_lists():
    assert flatten([[], [[]], 1]) == [1]
""",
    ),
    Spec(
        "swe-10-intervals",
        "spans",
        "merge",
        "merge_intervals() does not merge intervals that touch: [(1, 2), (2, 3)] should become [(1, 3)].",
        '''"""Merging closed intervals."""


def merge_intervals(intervals):
    """The union of closed intervals (start, end), as sorted disjoint intervals."""
    out = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((start, end))
    return out
''',
        ("        if out and start <= out[-1][1]:\n", "        if out and start < out[-1][1]:\n"),
        """from spans.merge import merge_intervals


def test_overlap():
    assert merge_intervals([(1, 3), (2, 4)]) == [(1, 4)]


def test_touching():
    assert merge_intervals([(1, 2), (2, 3)]) == [(1, 3)]
""",
        """from spans.merge import merge_intervals


def test_unsorted():
    assert merge_intervals([(5, 6), (1, 2)]) == [(1, 2), (5, 6)]


def test_chain_touching():
    assert merge_intervals([(3, 4), (1, 2), (2, 3)]) == [(1, 4)]


def test_contained():
    assert merge_intervals([(1, 10), (2, 3)]) == [(1, 10)]
""",
    ),
    Spec(
        "swe-11-snakecase",
        "casing",
        "snake",
        "to_snake('HTTPServer') gives 'h_t_t_p_server'; acronyms should stay together: 'http_server'. "
        "to_snake('getHTTPResponseCode') should be 'get_http_response_code'.",
        '''"""camelCase and PascalCase to snake_case."""

import re


def to_snake(name):
    """``name`` in snake_case; a run of capitals (an acronym) is one word."""
    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\\1_\\2", name)
    name = re.sub(r"([a-z0-9])([A-Z])", r"\\1_\\2", name)
    return name.lower()
''',
        (
            '    name = re.sub(r"([A-Z]+)([A-Z][a-z])", r"\\1_\\2", name)\n    name = re.sub(r"([a-z0-9])([A-Z])", r"\\1_\\2", name)\n'
            "    return name.lower()\n",
            '    return re.sub(r"(?<!^)([A-Z])", r"_\\1", name).lower()\n',
        ),
        """from casing.snake import to_snake


def test_camel():
    assert to_snake("camelCase") == "camel_case"


def test_acronym():
    assert to_snake("HTTPServer") == "http_server"
""",
        """from casing.snake import to_snake


def test_inner_acronym():
    assert to_snake("getHTTPResponseCode") == "get_http_response_code"


def test_pascal():
    assert to_snake("PascalCase") == "pascal_case"


def test_digits():
    assert to_snake("version2Update") == "version2_update"
""",
    ),
    Spec(
        "swe-12-transpose",
        "gridkit",
        "matrix",
        "transpose() is wrong for matrices that are not square: transpose([[1, 2, 3], [4, 5, 6]]) should give "
        "[[1, 4], [2, 5], [3, 6]], and a single column [[1], [2], [3]] raises IndexError.",
        '''"""Small matrices as lists of rows."""


def transpose(rows):
    """The transpose of a rectangular matrix given as a list of rows."""
    if not rows:
        return []
    return [[rows[i][j] for i in range(len(rows))] for j in range(len(rows[0]))]


def identity(n):
    return [[int(i == j) for j in range(n)] for i in range(n)]
''',
        ("for j in range(len(rows[0]))]", "for j in range(len(rows))]"),
        """from gridkit.matrix import identity, transpose


def test_square():
    assert transpose([[1, 2], [3, 4]]) == [[1, 3], [2, 4]]


def test_wide():
    assert transpose([[1, 2, 3], [4, 5, 6]]) == [[1, 4], [2, 5], [3, 6]]


def test_identity():
    assert transpose(identity(3)) == identity(3)
""",
        """from gridkit.matrix import transpose


def test_tall():
    assert transpose([[1], [2], [3]]) == [[1, 2, 3]]


def test_empty():
    assert transpose([]) == []


def test_twice():
    m = [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert transpose(transpose(m)) == m
""",
    ),
    Spec(
        "swe-13-deepmerge",
        "confkit",
        "merge",
        "deep_merge(base, override) replaces nested dictionaries instead of merging them: merging "
        "{'db': {'host': 'x', 'port': 1}} with {'db': {'port': 2}} loses 'host'.",
        '''"""Merging configuration dictionaries."""


def deep_merge(base, override):
    """A new dict: ``base`` updated by ``override``, nested dicts merged key by key."""
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out
''',
        (
            "        if isinstance(value, dict) and isinstance(out.get(key), dict):\n            out[key] = deep_merge(out[key], value)\n"
            "        else:\n            out[key] = value\n",
            "        out[key] = value\n",
        ),
        """from confkit.merge import deep_merge


def test_flat():
    assert deep_merge({"a": 1}, {"b": 2}) == {"a": 1, "b": 2}


def test_nested():
    merged = deep_merge({"db": {"host": "x", "port": 1}}, {"db": {"port": 2}})
    assert merged == {"db": {"host": "x", "port": 2}}
""",
        """from confkit.merge import deep_merge


def test_inputs_untouched():
    base = {"a": {"b": 1}}
    deep_merge(base, {"a": {"c": 2}})
    assert base == {"a": {"b": 1}}


def test_three_levels():
    assert deep_merge({"a": {"b": {"c": 1, "d": 2}}}, {"a": {"b": {"d": 3}}}) == {"a": {"b": {"c": 1, "d": 3}}}


def test_dict_replaces_scalar():
    assert deep_merge({"a": 1}, {"a": {"b": 2}}) == {"a": {"b": 2}}
""",
    ),
    Spec(
        "swe-14-rle",
        "codec",
        "rle",
        "rle_encode() drops the last run: rle_encode('aaabcc') returns [('a', 3), ('b', 1)] without ('c', 2).",
        '''"""Run-length encoding."""


def rle_encode(text):
    """``text`` as (character, run length) pairs."""
    runs = []
    for ch in text:
        if runs and runs[-1][0] == ch:
            runs[-1] = (ch, runs[-1][1] + 1)
        else:
            runs.append((ch, 1))
    return runs


def rle_decode(runs):
    return "".join(ch * n for ch, n in runs)
''',
        (
            """    runs = []
    for ch in text:
        if runs and runs[-1][0] == ch:
            runs[-1] = (ch, runs[-1][1] + 1)
        else:
            runs.append((ch, 1))
    return runs
""",
            """    runs, current, count = [], None, 0
    for ch in text:
        if ch == current:
            count += 1
        else:
            if current is not None:
                runs.append((current, count))
            current, count = ch, 1
    return runs
""",
        ),
        """from codec.rle import rle_decode, rle_encode


def test_decode():
    assert rle_decode([("a", 2), ("b", 1)]) == "aab"


def test_encode():
    assert rle_encode("aaabcc") == [("a", 3), ("b", 1), ("c", 2)]
""",
        """from codec.rle import rle_decode, rle_encode


def test_round_trip():
    for text in ["", "a", "abc", "zzzzzy", "aabbaa"]:
        assert rle_decode(rle_encode(text)) == text


def test_single_run():
    assert rle_encode("xxxx") == [("x", 4)]
""",
    ),
    Spec(
        "swe-15-palindrome",
        "wordplay",
        "palindrome",
        "is_palindrome('A man, a plan, a canal: Panama') returns False; case, spaces and punctuation must be ignored.",
        '''"""Palindromes."""


def is_palindrome(text):
    """Whether ``text`` reads the same backwards, looking only at letters and digits, ignoring case."""
    kept = [c.lower() for c in text if c.isalnum()]
    return kept == kept[::-1]
''',
        ("    kept = [c.lower() for c in text if c.isalnum()]\n", "    kept = list(text)\n"),
        """from wordplay.palindrome import is_palindrome


def test_word():
    assert is_palindrome("level")


def test_sentence():
    assert is_palindrome("A man, a plan, a canal: Panama")
""",
        """from wordplay.palindrome import is_palindrome


def test_not():
    assert not is_palindrome("palindrome")


def test_mixed_case():
    assert is_palindrome("RaceCar")


def test_digits():
    assert is_palindrome("12 3 21")
""",
    ),
    Spec(
        "swe-16-leapyear",
        "calendarkit",
        "years",
        "is_leap(1900) returns True, but 1900 was not a leap year: years divisible by 100 are leap years only when "
        "divisible by 400. days_in_month(1900, 2) is wrong too.",
        '''"""Leap years and month lengths (Gregorian calendar)."""

DAYS = [31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31]


def is_leap(year):
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def days_in_month(year, month):
    if not 1 <= month <= 12:
        raise ValueError("month must be 1..12")
    return 29 if month == 2 and is_leap(year) else DAYS[month - 1]
''',
        ("    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)\n", "    return year % 4 == 0\n"),
        """from calendarkit.years import days_in_month, is_leap


def test_2024():
    assert is_leap(2024)


def test_1900():
    assert not is_leap(1900)


def test_february():
    assert days_in_month(2023, 2) == 28
""",
        """from calendarkit.years import days_in_month, is_leap


def test_2000():
    assert is_leap(2000)


def test_2100():
    assert not is_leap(2100)


def test_feb_1900():
    assert days_in_month(1900, 2) == 28
""",
    ),
    Spec(
        "swe-17-temperature",
        "units",
        "temperature",
        "fahrenheit_to_celsius(212) returns about 194.2; it should return 100.0. The formula is wrong.",
        '''"""Temperature conversions."""


def celsius_to_fahrenheit(c):
    return c * 9 / 5 + 32


def fahrenheit_to_celsius(f):
    return (f - 32) * 5 / 9
''',
        ("    return (f - 32) * 5 / 9\n", "    return f - 32 * 5 / 9\n"),
        """from units.temperature import celsius_to_fahrenheit, fahrenheit_to_celsius


def test_c_to_f():
    assert celsius_to_fahrenheit(100) == 212


def test_f_to_c():
    assert fahrenheit_to_celsius(212) == 100
""",
        """import pytest
from units.temperature import celsius_to_fahrenheit, fahrenheit_to_celsius


def test_freezing():
    assert fahrenheit_to_celsius(32) == 0


def test_minus_forty():
    assert fahrenheit_to_celsius(-40) == -40


def test_round_trip():
    assert fahrenheit_to_celsius(celsius_to_fahrenheit(37.5)) == pytest.approx(37.5)
""",
    ),
    Spec(
        "swe-18-semver",
        "versions",
        "semver",
        "compare('1.10.0', '1.9.0') returns -1 (as if 1.10.0 were older); versions must be compared number by number.",
        '''"""Comparing dotted version numbers (MAJOR.MINOR.PATCH)."""


def parse(version):
    return tuple(int(part) for part in version.split("."))


def compare(a, b):
    """-1, 0 or 1 as version ``a`` is older than, the same as, or newer than ``b``."""
    pa, pb = parse(a), parse(b)
    return (pa > pb) - (pa < pb)
''',
        ("    pa, pb = parse(a), parse(b)\n", "    pa, pb = a, b\n"),
        """from versions.semver import compare


def test_equal():
    assert compare("1.2.3", "1.2.3") == 0


def test_minor_ten():
    assert compare("1.10.0", "1.9.0") == 1
""",
        """from versions.semver import compare, parse


def test_parse():
    assert parse("2.0.11") == (2, 0, 11)


def test_older():
    assert compare("0.9.9", "0.10.0") == -1


def test_sort():
    import functools

    found = sorted(["1.10.0", "1.2.0", "1.9.3"], key=functools.cmp_to_key(compare))
    assert found == ["1.2.0", "1.9.3", "1.10.0"]
""",
    ),
    Spec(
        "swe-19-csvsplit",
        "rowparse",
        "fields",
        "split_fields('a,\"b,c\",d') returns ['a', '\"b', 'c\"', 'd']; a comma inside double quotes belongs to the "
        "field, and the quotes are not part of it: the answer is ['a', 'b,c', 'd'].",
        '''"""Splitting one CSV line into fields."""


def split_fields(line):
    """The comma-separated fields of ``line``; a double-quoted field may hold commas ("" is a quote)."""
    fields, current, quoted, i = [], [], False, 0
    while i < len(line):
        ch = line[i]
        if quoted:
            if ch == '"' and line[i + 1 : i + 2] == '"':
                current.append('"')
                i += 1
            elif ch == '"':
                quoted = False
            else:
                current.append(ch)
        elif ch == '"':
            quoted = True
        elif ch == ",":
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    fields.append("".join(current))
    return fields
''',
        (
            """    fields, current, quoted, i = [], [], False, 0
    while i < len(line):
        ch = line[i]
        if quoted:
            if ch == '"' and line[i + 1 : i + 2] == '"':
                current.append('"')
                i += 1
            elif ch == '"':
                quoted = False
            else:
                current.append(ch)
        elif ch == '"':
            quoted = True
        elif ch == ",":
            fields.append("".join(current))
            current = []
        else:
            current.append(ch)
        i += 1
    fields.append("".join(current))
    return fields
""",
            """    return line.split(",")
""",
        ),
        """from rowparse.fields import split_fields


def test_plain():
    assert split_fields("a,b,c") == ["a", "b", "c"]


def test_quoted_comma():
    assert split_fields('a,"b,c",d') == ["a", "b,c", "d"]
""",
        '''from rowparse.fields import split_fields


def test_escaped_quote():
    assert split_fields('"say ""hi""",x') == ['say "hi"', "x"]


def test_empty_fields():
    assert split_fields(",,") == ["", "", ""]


def test_quoted_empty():
    assert split_fields('"",a') == ["", "a"]
''',
    ),
    Spec(
        "swe-20-account",
        "ledger",
        "account",
        "Account.withdraw() lets the balance go below zero: withdrawing 150 from a balance of 100 must raise "
        "InsufficientFunds and leave the balance at 100.",
        '''"""A bank account."""


class InsufficientFunds(Exception):
    pass


class Account:
    def __init__(self, balance=0):
        self.balance = balance

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("deposit must be positive")
        self.balance += amount

    def withdraw(self, amount):
        if amount <= 0:
            raise ValueError("withdrawal must be positive")
        if amount > self.balance:
            raise InsufficientFunds(f"balance {self.balance} < {amount}")
        self.balance -= amount
''',
        (
            '        if amount > self.balance:\n            raise InsufficientFunds(f"balance {self.balance} < {amount}")\n',
            "",
        ),
        """import pytest
from ledger.account import Account, InsufficientFunds


def test_deposit():
    a = Account()
    a.deposit(5)
    assert a.balance == 5


def test_overdraft():
    a = Account(100)
    with pytest.raises(InsufficientFunds):
        a.withdraw(150)
    assert a.balance == 100
""",
        """import pytest
from ledger.account import Account, InsufficientFunds


def test_withdraw_all():
    a = Account(10)
    a.withdraw(10)
    assert a.balance == 0


def test_empty_account():
    with pytest.raises(InsufficientFunds):
        Account().withdraw(1)


def test_negative_withdrawal():
    with pytest.raises(ValueError):
        Account(5).withdraw(-1)
""",
    ),
    Spec(
        "swe-21-queue",
        "containers",
        "fifo",
        "Queue.dequeue() returns the most recently added item; a queue is first in, first out.",
        '''"""A FIFO queue."""

from collections import deque


class Empty(Exception):
    pass


class Queue:
    def __init__(self):
        self._items = deque()

    def enqueue(self, item):
        self._items.append(item)

    def dequeue(self):
        if not self._items:
            raise Empty("dequeue from an empty queue")
        return self._items.popleft()

    def __len__(self):
        return len(self._items)
''',
        ("        return self._items.popleft()\n", "        return self._items.pop()\n"),
        """from containers.fifo import Queue


def test_len():
    q = Queue()
    q.enqueue(1)
    assert len(q) == 1


def test_order():
    q = Queue()
    for i in range(3):
        q.enqueue(i)
    assert [q.dequeue() for _ in range(3)] == [0, 1, 2]
""",
        """import pytest
from containers.fifo import Empty, Queue


def test_interleaved():
    q = Queue()
    q.enqueue("a")
    q.enqueue("b")
    assert q.dequeue() == "a"
    q.enqueue("c")
    assert [q.dequeue(), q.dequeue()] == ["b", "c"]


def test_empty():
    with pytest.raises(Empty):
        Queue().dequeue()
""",
    ),
    Spec(
        "swe-22-bytesize",
        "humanize",
        "sizes",
        "format_size(1024) gives '1024 B'; exactly 1024 bytes is '1.0 KiB' (and 1048576 is '1.0 MiB').",
        '''"""Human-readable byte counts (binary units)."""

UNITS = ["B", "KiB", "MiB", "GiB", "TiB"]


def format_size(n):
    """``n`` bytes as '123 B', '1.5 KiB', '2.0 MiB', ..."""
    if n < 0:
        raise ValueError("negative size")
    value, unit = float(n), 0
    while value >= 1024 and unit < len(UNITS) - 1:
        value /= 1024
        unit += 1
    return f"{int(value)} B" if unit == 0 else f"{value:.1f} {UNITS[unit]}"
''',
        ("    while value >= 1024 and unit < len(UNITS) - 1:\n", "    while value > 1024 and unit < len(UNITS) - 1:\n"),
        """from humanize.sizes import format_size


def test_bytes():
    assert format_size(512) == "512 B"


def test_one_kib():
    assert format_size(1024) == "1.0 KiB"
""",
        """import pytest
from humanize.sizes import format_size


def test_one_mib():
    assert format_size(1048576) == "1.0 MiB"


def test_fraction():
    assert format_size(1536) == "1.5 KiB"


def test_negative():
    with pytest.raises(ValueError):
        format_size(-1)
""",
    ),
    Spec(
        "swe-23-shortestpath",
        "graphs",
        "paths",
        "shortest_path(graph, start, goal) returns the path without its start node: for a->b->c it gives "
        "['b', 'c']; it must be ['a', 'b', 'c'] (and ['a'] when start is the goal).",
        '''"""Breadth-first shortest paths in unweighted graphs (adjacency dicts)."""

from collections import deque


def shortest_path(graph, start, goal):
    """The nodes of a shortest path from ``start`` to ``goal``, both included; None if there is none."""
    parents = {start: None}
    todo = deque([start])
    while todo:
        node = todo.popleft()
        if node == goal:
            path = []
            while node is not None:
                path.append(node)
                node = parents[node]
            return path[::-1]
        for nxt in graph.get(node, ()):
            if nxt not in parents:
                parents[nxt] = node
                todo.append(nxt)
    return None
''',
        (
            "            while node is not None:\n                path.append(node)\n                node = parents[node]\n",
            "            while parents[node] is not None:\n                path.append(node)\n                node = parents[node]\n",
        ),
        """from graphs.paths import shortest_path


def test_no_path():
    assert shortest_path({"a": ["b"]}, "a", "z") is None


def test_line():
    assert shortest_path({"a": ["b"], "b": ["c"]}, "a", "c") == ["a", "b", "c"]
""",
        """from graphs.paths import shortest_path


def test_start_is_goal():
    assert shortest_path({}, "a", "a") == ["a"]


def test_shortest_of_two():
    g = {"a": ["b", "d"], "b": ["c"], "c": ["e"], "d": ["e"]}
    assert shortest_path(g, "a", "e") == ["a", "d", "e"]


def test_cycle():
    g = {"a": ["b"], "b": ["a", "c"], "c": []}
    assert shortest_path(g, "a", "c") == ["a", "b", "c"]
""",
    ),
    Spec(
        "swe-24-calc",
        "mathexpr",
        "evaluate",
        "evaluate('2+3*4') returns 20; multiplication and division bind tighter than addition and subtraction, so the answer is 14.",
        '''"""Evaluating arithmetic expressions with + - * / and parentheses."""

import re

TOKEN = re.compile(r"\\s*(?:(\\d+(?:\\.\\d+)?)|(.))")


def tokens(text):
    out = []
    for number, op in TOKEN.findall(text):
        out.append(float(number) if number else op)
    return out


def evaluate(text):
    """The value of ``text``, with the usual precedence."""
    items = tokens(text)
    pos = 0

    def peek():
        return items[pos] if pos < len(items) else None

    def take():
        nonlocal pos
        pos += 1
        return items[pos - 1]

    def atom():
        tok = take()
        if tok == "(":
            value = expr()
            take()
            return value
        if tok == "-":
            return -atom()
        return tok

    def term():
        value = atom()
        while peek() in ("*", "/"):
            value = value * atom() if take() == "*" else value / atom()
        return value

    def expr():
        value = term()
        while peek() in ("+", "-"):
            value = value + term() if take() == "+" else value - term()
        return value

    return expr()
''',
        (
            """    def term():
        value = atom()
        while peek() in ("*", "/"):
            value = value * atom() if take() == "*" else value / atom()
        return value

    def expr():
        value = term()
        while peek() in ("+", "-"):
            value = value + term() if take() == "+" else value - term()
        return value
""",
            """    def expr():
        value = atom()
        while peek() in ("+", "-", "*", "/"):
            op = take()
            right = atom()
            value = {"+": value + right, "-": value - right, "*": value * right}.get(op, value / right if right else 0)
        return value
""",
        ),
        """from mathexpr.evaluate import evaluate


def test_sum():
    assert evaluate("1 + 2") == 3


def test_precedence():
    assert evaluate("2+3*4") == 14
""",
        """from mathexpr.evaluate import evaluate


def test_parentheses():
    assert evaluate("(2+3)*4") == 20


def test_division_first():
    assert evaluate("10 - 6 / 2") == 7


def test_negative():
    assert evaluate("-3 * -2 + 1") == 7
""",
    ),
]


def write(spec: Spec, root: str) -> str:
    """The task directory of ``spec`` under ``root`` (replaced if it exists)."""
    correct, buggy = spec.bug
    if spec.source.count(correct) != 1:
        raise ValueError(f"{spec.id}: the bug's correct snippet occurs {spec.source.count(correct)} times in the module")
    d = os.path.join(root, spec.id)
    shutil.rmtree(d, ignore_errors=True)
    module = f"{spec.package}/{spec.module}.py"
    files = {
        f"repo/{spec.package}/__init__.py": f'"""{spec.package}: see {spec.module}.py."""\n',
        f"repo/{module}": spec.source.replace(correct, buggy),
        f"repo/tests/test_{spec.module}.py": spec.tests,
        "repo/README.md": f"# {spec.package}\n\nRun the tests with `python -m pytest -q tests`.\n",
        f"checks/test_{spec.module}_checks.py": spec.checks,
        f"reference/solution/{module}": spec.source,
    }
    for rel, text in files.items():
        os.makedirs(os.path.dirname(os.path.join(d, rel)), exist_ok=True)
        with open(os.path.join(d, rel), "w") as f:
            f.write(text)
    task = {"id": spec.id, "prompt": spec.prompt, "protected": ["tests"], "tests": ["tests"], "timeout_s": 60}
    with open(os.path.join(d, "task.json"), "w") as f:
        json.dump(task, f, indent=2)
        f.write("\n")
    return d


def failing(task_dir: str, solved: bool) -> int:
    """How many tests fail on the task's repository (with its reference solution when ``solved``),
    checks and visible tests together; pytest in a scratch copy on this host."""
    with tempfile.TemporaryDirectory() as tmp:
        shutil.copytree(os.path.join(task_dir, "repo"), os.path.join(tmp, "workspace"))
        shutil.copytree(os.path.join(task_dir, "checks"), os.path.join(tmp, "checks"))
        if solved:
            shutil.copytree(os.path.join(task_dir, "reference", "solution"), os.path.join(tmp, "workspace"), dirs_exist_ok=True)
        env = {**os.environ, "PYTHONPATH": os.path.join(tmp, "workspace"), "PYTHONDONTWRITEBYTECODE": "1"}
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", tmp, "checks", "workspace/tests"]
        p = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True)
        if p.returncode not in (0, 1):
            raise RuntimeError(f"{task_dir}: pytest exited {p.returncode}:\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
        return 0 if p.returncode == 0 else int(p.stdout.strip().splitlines()[-1].split(" failed")[0].split()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check-only", action="store_true", help="check the tasks as they are, write nothing")
    args = parser.parse_args()
    ids = [s.id for s in TASKS]
    if len(set(ids)) != len(ids) or len({s.package for s in TASKS}) != len(TASKS):
        raise SystemExit("task ids and package names must be distinct")
    for spec in TASKS:
        d = os.path.join(HERE, spec.id) if args.check_only else write(spec, HERE)
        broken, fixed = failing(d, solved=False), failing(d, solved=True)
        if broken == 0 or fixed != 0:
            raise SystemExit(f"{spec.id}: {broken} tests fail on the bug (want > 0), {fixed} with the solution (want 0)")
        print(f"{spec.id}: {broken} failing with the bug, 0 with the reference solution")


if __name__ == "__main__":
    main()
