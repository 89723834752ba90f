"""``python -m areal.view RUN_DIR``: serve the run's viewer on localhost (``--port``, default
8765), or with ``--html OUT.html`` write it as one self-contained file and exit."""

from __future__ import annotations

import argparse
from pathlib import Path

from areal.view.data import RunView
from areal.view.server import serve, write_html


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m areal.view", description=__doc__)
    parser.add_argument("run_dir", type=Path, help="a run directory of areal.train (holds episodes.jsonl)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--html", type=Path, help="write a static, self-contained page here instead of serving")
    args = parser.parse_args()
    view = RunView(args.run_dir)
    if args.html:
        write_html(view, args.html)
        print(f"wrote {args.html}")
        return
    serve(view, args.host, args.port)


if __name__ == "__main__":
    main()
