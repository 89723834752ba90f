"""AReaL's ``areal.utils.stats_tracker``: the process's ``areal.agent.stats.Tracker``."""

from areal.agent.stats import DEFAULT, Tracker

get, scalar, stat, scope, record_timing, export = (
    DEFAULT.get,
    DEFAULT.scalar,
    DEFAULT.stat,
    DEFAULT.scope,
    DEFAULT.record_timing,
    DEFAULT.export,
)

__all__ = ["Tracker", "get", "scalar", "stat", "scope", "record_timing", "export"]
