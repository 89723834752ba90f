"""The browser the viewer tests drive: the system's chromium through Playwright (no download)."""

from __future__ import annotations

import os
import shutil

import pytest


def browser_or_skip() -> str:
    """The system's chromium, or a skip (a failure with AREAL_REQUIRE_BROWSER=1) naming what is missing."""
    missing = []
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        missing.append("the playwright package (pip install playwright, pinned in requirements.lock)")
    chromium = shutil.which("chromium")
    if chromium is None:
        missing.append("chromium (apt-get install chromium)")
    if missing:
        why = "browser test needs " + " and ".join(missing)
        if os.environ.get("AREAL_REQUIRE_BROWSER") == "1":
            pytest.fail(why + " (AREAL_REQUIRE_BROWSER=1)")
        pytest.skip(why)
    return chromium
