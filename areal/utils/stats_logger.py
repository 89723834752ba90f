"""AReaL's ``areal.utils.stats_logger.StatsLogger``: where a run's logs go (its run directory).

A run's metrics are written by the controller (``metrics.jsonl`` in the run directory); this
class gives AReaL's scripts the paths they build from ``config.stats_logger``.
"""

from __future__ import annotations

import os
from typing import Any


class StatsLogger:
    @staticmethod
    def get_log_path(config: Any) -> str:
        """``<fileroot>/<experiment_name>/<trial_name>``: the run directory ``PPOTrainer`` uses."""
        return os.path.join(config.fileroot, config.experiment_name, config.trial_name)
