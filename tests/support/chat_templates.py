"""Real chat templates of the model families the gateway serves, for tests: fetched, never copied.

The templates are the ones llama.cpp keeps as its test fixtures (``models/templates/*.jinja``,
each fetched from the model's own ``tokenizer_config.json``), shipped inside the
``llama-cpp-python`` sdist on PyPI. ``make test`` runs this file once (``pip download`` of the
pinned sdist into ``$AREAL_CACHE``, default ``~/.cache/areal``); the ``.jinja`` files are kept in
``$AREAL_CACHE/chat-templates/llama-cpp-python-<version>/`` and the archive is deleted, so later
runs need no network. A test that finds no folder fetches it the same way.

    python tests/support/chat_templates.py        # fetch (no-op when present); prints the folder
"""

from __future__ import annotations

import tarfile
from pathlib import Path

from pypi_files import fetched

PACKAGE, VERSION = "llama-cpp-python", "0.3.36"
INSIDE = "vendor/llama.cpp/models/templates/"  # where the sdist keeps them (under its top folder)


def templates_dir() -> Path:
    """The folder of ``.jinja`` files, fetched on first use."""
    return fetched("chat-templates", PACKAGE, VERSION, False, _templates)


def _templates(archive: Path, out: Path) -> None:
    with tarfile.open(archive) as tar:
        for member in tar.getmembers():
            name = member.name.split("/", 1)[-1]
            if member.isfile() and name.startswith(INSIDE) and name.endswith(".jinja") and "/" not in name[len(INSIDE) :]:
                (out / Path(name).name).write_bytes(tar.extractfile(member).read())  # type: ignore[union-attr]
    if not any(out.iterdir()):
        raise RuntimeError(f"{archive.name} holds no {INSIDE}*.jinja")


def template(name: str) -> str:
    """The text of ``<name>.jinja`` (e.g. ``Qwen-Qwen3-0.6B``)."""
    return (templates_dir() / f"{name}.jinja").read_text()


if __name__ == "__main__":
    print(templates_dir())
