"""The browser the viewer tests drive: the system's chromium through Playwright (no download);
the viewer's server on a run (``view_server``) and a page of it, open and ready (``open_page``)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from paths import ROOT


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


@contextlib.contextmanager
def chromium_browser() -> Iterator[Any]:
    """Playwright's handle on the system's chromium (a skip, or a failure under
    AREAL_REQUIRE_BROWSER=1, when either is missing), closed on leaving."""
    chromium = browser_or_skip()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        # --no-sandbox: CI runs as root, where Chromium refuses its own sandbox
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def view_server(run_dir: Path) -> Iterator[str]:
    """``python -m areal.view run_dir`` on a free port; yields its URL once it answers (60 s at
    most, else the test fails with its output), and stops it on leaving."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "areal.view", str(run_dir), "--port", str(port)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                urllib.request.urlopen(url + "api/run", timeout=2).read()
                break
            except OSError:
                assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
                assert time.monotonic() < deadline, "the viewer did not answer within 60 s"
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(10)


def open_page(browser: Any, url: str) -> tuple[Any, list[str]]:
    """A new page at ``url``, once the viewer has rendered it; with the list its script errors
    and console errors are appended to (a test asserts it stays empty)."""
    page = browser.new_page(viewport={"width": 1500, "height": 1100})
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(url)
    page.wait_for_selector("body[data-ready='1']", state="attached", timeout=30_000)
    return page, errors
