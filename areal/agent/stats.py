"""Scalars that workflows report during a run, averaged into each step's line of metrics.jsonl.

AReaL's workflows write ``stats_tracker.get(scope).scalar(reward=r)`` (scope ``rollout`` or
``eval-rollout``) and time blocks with ``record_timing(name)``; ``areal.utils.stats_tracker`` is
that surface over one ``Tracker`` per process. The controller runs in-process workflows
(``RolloutWorkflow``, inline agents) in its own event loop, so what they record here reaches its
``export()`` at the next step: ``<scope>/<key>`` → the mean of the values since the last export.
What sandboxed agents record stays in their own process (and is lost with it).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator


class Tracker:
    """Named scalar streams; ``scope(name)`` nests a prefix, ``export()`` averages and clears."""

    def __init__(self, prefix: str = "", root: Tracker | None = None) -> None:
        self.prefix = prefix
        self.root = root or self
        if root is None:
            self.values: dict[str, list[float]] = {}
            self.lock = threading.Lock()

    def _key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def scalar(self, **values: float) -> None:
        """Record one value per keyword (``scalar(reward=1.0)``)."""
        with self.root.lock:
            for name, v in values.items():
                self.root.values.setdefault(self._key(name), []).append(float(v))

    stat = scalar

    def get(self, name: str) -> Tracker:
        """The tracker under ``name`` (a scope such as ``rollout``)."""
        return Tracker(self._key(name), self.root)

    @contextlib.contextmanager
    def scope(self, name: str) -> Iterator[Tracker]:
        yield self.get(name)

    @contextlib.contextmanager
    def record_timing(self, name: str) -> Iterator[None]:
        """Time the block as ``timeperf/<name>`` seconds."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            self.get("timeperf").scalar(**{name: time.perf_counter() - t0})

    def export(self, reset: bool = True) -> dict[str, float]:
        """The mean of each stream since the last export; cleared when ``reset``."""
        with self.root.lock:
            out = {k: sum(v) / len(v) for k, v in self.root.values.items() if v}
            if reset:
                self.root.values.clear()
        return out


DEFAULT = Tracker()
