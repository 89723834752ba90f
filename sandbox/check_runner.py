"""The checks' process of sandbox/grader.py: pytest, reporting each event as a JSON line on a pipe.

Run as ``python -I -B check_runner.py FD [PATH]... -- [PYTEST ARG]...``
(never imported): ``FD`` the report pipe's write end; each ``PATH`` (the task's pythonpath in the
workspace) appended to sys.path once pytest is imported, so that the workspace's modules shadow
none of the standard library's or pytest's. Lines: ``{"event": "collected", "nodeids": [...]}``,
``{"event": "report", "nodeid", "when", "outcome"}`` per phase of each test,
``{"event": "interrupted", "by"}`` (pytest.exit, KeyboardInterrupt), ``{"event": "finished",
"exitstatus"}`` last. Python only (the process is ``-I``: this file imports nothing of the project).
"""

import json
import os
import sys


def main() -> int:
    fd, rest = int(sys.argv[1]), sys.argv[2:]
    cut = rest.index("--")
    paths, args = rest[:cut], rest[cut + 1 :]
    import pytest  # first: nothing of the workspace is on sys.path yet

    out = os.fdopen(fd, "w", buffering=1)

    def emit(**event: object) -> None:
        out.write(json.dumps(event) + "\n")

    class Reporter:
        def pytest_collection_finish(self, session: pytest.Session) -> None:
            emit(event="collected", nodeids=[item.nodeid for item in session.items])

        def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
            emit(event="report", nodeid=report.nodeid, when=report.when, outcome=report.outcome)

        def pytest_keyboard_interrupt(self, excinfo: pytest.ExceptionInfo) -> None:
            emit(event="interrupted", by=excinfo.typename)

        def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
            emit(event="finished", exitstatus=int(exitstatus))

    sys.path.extend(paths)
    code = pytest.main(args, plugins=[Reporter()])
    out.close()
    return int(code)


if __name__ == "__main__":
    sys.exit(main())
