"""AReaL's ``areal.utils`` import paths: ``dynamic_import`` and ``hf_utils`` (thin helpers)."""
