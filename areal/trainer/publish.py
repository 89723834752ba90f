"""Publishing a version: save it whole (atomic rename), load it on every engine, prune, report.

    weights of step s ─► run_dir/weights/.tmp-vs ─rename─► vs ─► POST /update_weights_from_disk
                     (every engine; vLLM: its reload routes; a failure is WeightUpdateError)
                     ─► prune to keep_versions
    then TrainerReport to the controller (areal/trainer/reports.py)

Invariant: ``TrainerReport(version=s)`` is sent only after every engine answered success for
version ``s``; a failed update is an error and a non-zero exit, never a skip.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

import torch

from areal.engine.client import EngineError, EngineUnavailable
from areal.engine.vllm import vllm_update_weights_sync
from areal.weights.collective import WeightUpdateError

TOKENIZER_FILES = (
    "tokenizer*",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.*",
    "merges.txt",
    "chat_template*",
    "*.tiktoken",
    "spiece.model",
)


def copy_tokenizer_files(src: str | Path, dst: str | Path) -> list[str]:
    """Copy whatever tokenizer files ``src`` has into ``dst``; a dir without any is fine."""
    copied = []
    for pattern in TOKENIZER_FILES:
        for path in sorted(Path(src).glob(pattern)):
            if path.is_file():
                shutil.copy2(path, Path(dst) / path.name)
                copied.append(path.name)
    return copied


def save_atomically(model: torch.nn.Module, target: Path, tokenizer_src: str) -> Path:
    """save_pretrained into ``.tmp-<name>`` beside ``target``, then rename it into place."""
    tmp = target.parent / f".tmp-{target.name}"
    for stale in (tmp, target):  # leftovers of a crashed or repeated run
        if stale.exists():
            shutil.rmtree(stale)
    model.save_pretrained(tmp)
    copy_tokenizer_files(tokenizer_src, tmp)
    os.rename(tmp, target)
    return target


def _post_json(url: str, path: str, body: dict, timeout_s: float) -> dict:
    req = urllib.request.Request(
        url.rstrip("/") + path, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        return json.loads(resp.read() or b"{}")


def push_weights(urls: list[str], model_dir: Path, version: int, timeout_s: float, pause: bool = True, kind: str = "sglang") -> list[str]:
    """Load ``model_dir`` as ``version`` on every engine that can be reached; returns the URLs
    skipped because nothing answered there (refused or reset: an engine that died, which its
    owner restarts and brings to the newest version). Raises WeightUpdateError when an engine
    answers with a failure, times out, or when no engine at all took the version.

    With ``pause`` (SGLang's protocol): ``/pause_generation`` in ``abort`` mode first, so the
    update does not wait for running generations. Each comes back to its client with the tokens it
    has; ``EngineClient`` resubmits it (prompt + those tokens) after ``/continue_generation`` and
    stitches the parts, so every token keeps the version that sampled it. (``retract`` would resume
    inside the engine, but SGLang then reports one weight_version for the whole request.)
    Without ``pause``, the engine finishes running requests before loading.

    ``kind="vllm"``: vLLM's own routes instead (``areal.engine.vllm.vllm_update_weights_sync``),
    always paused in ``abort`` mode whatever ``pause`` says: that pause also clears vLLM's KV and
    prefix caches, which would otherwise keep serving what the old weights computed.
    """
    skipped = []
    for url in urls:
        try:
            if kind == "vllm":
                _vllm_update(url, model_dir, version, timeout_s)
                continue
            if pause:
                _post_json(url, "/pause_generation", {"mode": "abort"}, timeout_s)
            try:
                reply = _post_json(
                    url, "/update_weights_from_disk", {"model_path": str(model_dir), "weight_version": str(version)}, timeout_s
                )
            finally:
                if pause:
                    _post_json(url, "/continue_generation", {}, timeout_s)
        except OSError as e:  # URLError, HTTPError, refused, timeout: name the engine and version
            if _unreachable(e) and len(urls) > 1:
                print(f"[trainer] {url} cannot be reached ({e}); v{version} skipped there", file=sys.stderr, flush=True)
                skipped.append(url)
                continue
            raise WeightUpdateError(f"{url}: update to v{version} failed: {e}") from e
        if not reply.get("success"):
            raise WeightUpdateError(f"{url}: update to v{version} not confirmed: {reply}")
    if urls and len(skipped) == len(urls):
        raise WeightUpdateError(f"no engine could be reached for v{version}: {urls}")
    return skipped


def _vllm_update(url: str, model_dir: Path, version: int, timeout_s: float) -> None:
    """One vLLM server loads ``model_dir`` as ``version``; no answer is the OSError under it."""
    try:
        vllm_update_weights_sync(url, model_dir, version, timeout_s=timeout_s)
    except EngineUnavailable as e:
        raise (e.__cause__ if isinstance(e.__cause__, OSError) else OSError(str(e))) from e
    except EngineError as e:
        raise WeightUpdateError(f"{url}: update to v{version} failed: {e}") from e


def _unreachable(e: OSError) -> bool:
    """Nothing listens there (or it went away mid-request), as opposed to an answer or a timeout."""
    reason = e.reason if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError) else e
    return isinstance(reason, (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected))


def prune_versions(weights_dir: Path, version: int, keep: int) -> None:
    """Delete weight dirs v{k} with k <= version - keep (engines already serve ``version``)."""
    for path in weights_dir.glob("v*"):
        k = path.name[1:]
        if k.isdigit() and int(k) <= version - keep:
            shutil.rmtree(path)
