"""The test tree itself: pytest imports each test file by its base name (the folders have no
``__init__.py``, so that a newcomer's new folder needs none), so two test files with the same
name in two folders stop the run with an "import file mismatch" error for the second."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_no_two_test_files_share_a_name():
    seen: dict[str, list[str]] = defaultdict(list)
    for path in [*(ROOT / "tests").rglob("test_*.py"), *(ROOT / "benchmarks" / "tests").rglob("test_*.py")]:
        if "node_modules" not in path.parts:
            seen[path.name].append(str(path.relative_to(ROOT)))
    assert {name: paths for name, paths in seen.items() if len(paths) > 1} == {}
