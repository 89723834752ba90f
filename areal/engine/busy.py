"""When the embedded engine computes, as wall-clock spans (``engine.busy_log``): one JSON line per
span, ``{"kind": "generate" | "load", "start": t0, "end": t1}`` in ``time.time()`` seconds, so
that they line up with the trainer's step times on the same host (benchmarks/machinery.py).

    generation worker: _tick (admit + decode + sample) ─► add("generate", t0, t1)
                       a weight load (disk or broadcast) ─► add("load", t0, t1)
                       about to block on an empty queue  ─► flush()

Back-to-back ticks of one kind (gap under ``MERGE_GAP_S``) are merged into one span, so a busy
engine writes a line per burst, not per token; a span is written when it closes (another kind,
a gap, an idle engine, shutdown). Written by the worker thread alone.
"""

from __future__ import annotations

import json
from pathlib import Path

MERGE_GAP_S = 0.005  # ticks closer than this are one span


class BusySpans:
    """Merges and appends the spans of one engine to ``path`` (line-buffered)."""

    def __init__(self, path: str) -> None:
        self.file = open(path, "a", buffering=1)  # noqa: SIM115 -- open for the engine's life, closed by close()
        self.kind = ""
        self.start = self.end = 0.0

    def add(self, kind: str, start: float, end: float) -> None:
        if kind == self.kind and start - self.end < MERGE_GAP_S:
            self.end = end
            return
        self.flush()
        self.kind, self.start, self.end = kind, start, end

    def flush(self) -> None:
        if self.kind:
            self.file.write(json.dumps({"kind": self.kind, "start": self.start, "end": self.end}) + "\n")
            self.kind = ""

    def close(self) -> None:
        self.flush()
        self.file.close()


def read_spans(path: Path) -> list[tuple[str, float, float]]:
    """The spans of one engine's busy log as (kind, start, end), in the order written (a last line
    cut short by a kill is skipped)."""
    out = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            out.append((row["kind"], float(row["start"]), float(row["end"])))
        except (ValueError, KeyError, TypeError):
            continue
    return out
