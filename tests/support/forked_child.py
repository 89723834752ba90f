"""A child for the fork server's tests (tests/integration/forkserver): ``python -m forked_child
WHAT [ARG]`` does one thing a real child (the engine, the trainer) relies on and says what it saw."""

from __future__ import annotations

import json
import os
import signal
import sys
import time


def main(argv: list[str]) -> int:
    what = argv[0]
    if what == "report":  # what a new interpreter would see: its args, env, cwd, session, signals
        print(
            json.dumps(
                {
                    "argv": argv,
                    "env": os.environ.get("FORKED_CHILD_VALUE"),
                    "cwd": os.getcwd(),
                    "path": sys.path[:2],
                    "session_leader": os.getsid(0) == os.getpid(),
                    "sigterm_default": signal.getsignal(signal.SIGTERM) == signal.SIG_DFL,
                    "sigint_raises": signal.getsignal(signal.SIGINT) is signal.default_int_handler,
                    "stdin": sys.stdin.read(),
                    "main": __name__,
                    "cmdline": open("/proc/self/cmdline", "rb").read().rstrip(b"\0").decode(),
                    "comm": open("/proc/self/comm").read().strip(),
                }
            )
        )
        print("to stderr", file=sys.stderr)
        return 0
    if what == "exit":
        sys.exit(int(argv[1]))
    if what == "raise":
        raise RuntimeError("raised by forked_child")
    if what == "burn":  # CPU the parent's RUSAGE_CHILDREN must count
        end = time.process_time() + float(argv[1])
        while time.process_time() < end:
            pass
        return 0
    if what == "stubborn":  # ignores SIGTERM: only SIGKILL ends it
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        what = "sleep"
    if what == "sleep":  # until a signal ends it; its pid file says it started
        with open(argv[1], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(600)
        return 0
    raise SystemExit(f"unknown request {what!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
