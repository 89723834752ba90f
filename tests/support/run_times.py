"""Where a test run's time went, from the JUnit XML pytest writes (``--junitxml=FILE``): the time of
each tier, read from its folder (tests/unit, tests/integration, tests/e2e, benchmarks/tests: the XML
carries no markers), and the files that took longest, set-up and tear-down included. ``.ci/run`` prints it after ``make test``, so that
the CI's log says what to cut or share next.

    python tests/support/run_times.py FILE [--top N]
"""

from __future__ import annotations

import argparse
import collections
import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def file_times(junit: Path) -> dict[str, float]:
    """Seconds per test file (its tests' times summed: pytest puts set-up and tear-down in them)."""
    times: collections.Counter[str] = collections.Counter()
    for case in ET.parse(junit).getroot().iter("testcase"):
        module = case.get("classname", "")  # "tests.unit.gateway.test_x" (".Class" for class tests)
        parts = module.split(".")
        name = next((i for i, p in enumerate(parts) if p.startswith("test_")), len(parts) - 1)
        times["/".join(parts[: name + 1]) + ".py"] += float(case.get("time", 0.0))
    return dict(times)


def folder_of(path: str) -> str:
    """The tier a file belongs to: its first two folders (tests/unit, benchmarks/tests, ...)."""
    return "/".join(path.split("/")[:2])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("junit", type=Path)
    ap.add_argument("--top", type=int, default=15)
    args = ap.parse_args(argv)
    if not args.junit.is_file():
        print(f"run_times: no JUnit XML at {args.junit}", file=sys.stderr)
        return 2
    times = file_times(args.junit)
    total = sum(times.values())
    folders: collections.Counter[str] = collections.Counter()
    for path, s in times.items():
        folders[folder_of(path)] += s
    print(f"test time summed over the workers: {total:.0f} s in {len(times)} files")
    for folder, s in folders.most_common():
        print(f"  {s:7.0f} s  {100 * s / max(total, 1e-9):4.1f} %  {folder}")
    print(f"the {args.top} longest files:")
    for path, s in sorted(times.items(), key=lambda kv: -kv[1])[: args.top]:
        print(f"  {s:7.0f} s  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
