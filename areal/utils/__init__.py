"""AReaL's ``areal.utils`` import paths: ``dynamic_import``, ``hf_utils``, ``logging``, ``stats_logger``, ``stats_tracker``."""
