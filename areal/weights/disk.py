"""Weights from the trainer to inference engines through the file system (``trainer.weight_sync=disk``).

Both ends of the boundary live here: the trainer saves a version whole and every engine loads it
by its protocol's one route. The same route brings a restarted engine to the newest version
(``areal.engine.fleet``) and serves the engine clients' ``update_weights_from_disk``
(``VLLMClient`` calls ``vllm_update_weights_sync``; ``EngineClient`` sends the same request,
``update_body`` and ``check_update`` of areal/engine/client.py, over its connection pool).

    trainer                                        SGLang protocol (SGLang, the embedded engine)
    save_atomically ─► weights/.tmp-vS ─rename─► vS
    push_weights(urls, vS, S) ── per engine ──►    update_weights_from_disk_sync
                                                     POST /pause_generation {"mode": "abort"}   (pause=True)
                                                     POST /update_weights_from_disk {model_path, weight_version}
                                                     POST /continue_generation                   (always, if paused)
                              ── kind="vllm" ──►   vllm_update_weights_sync (vLLM's own routes)
                                                     GET /is_paused; POST /pause?mode=abort
                                                     POST /collective_rpc {"method": "reload_weights", ...}
                                                     POST /update_weight_version {"new_version": S}
                                                     POST /resume                                (always)
    prune_versions ─► rm -r v{k}, k <= S - keep

Invariants:
- A version's dir appears only whole (written under ``.tmp-vS``, then renamed); engines load
  nothing else.
- ``push_weights`` returns only when every engine that answered confirmed version ``S``: an
  error answer or a timeout is ``WeightUpdateError`` naming the engine and the version; an engine
  that cannot be reached (refused, reset: dead, its fleet restarts it) is skipped, unless no
  engine at all took the version.
- Every request is one ``request_json`` (areal/engine/client.py): an error answer is
  ``EngineError``, no answer ``EngineUnavailable``, on every route.
- A vLLM weight dir is checked before the pause (it must hold weight files): vLLM's in-place
  reload from a bad path leaves the model on meta tensors and its engine dies on the next step.
  The check reads the path on this machine, so trainer and server must share the file system.

This module imports no torch (the controller's fleet loads versions with it); ``save_atomically``
takes a model that has ``save_pretrained``.
"""

from __future__ import annotations

import http.client
import os
import shutil
import sys
import urllib.error
from pathlib import Path
from typing import TYPE_CHECKING, Any

from areal.engine.client import EngineError, EngineUnavailable, check_update, request_json, update_body
from areal.weights import WeightUpdateError

if TYPE_CHECKING:
    import torch

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
VLLM_NEEDS_DEV_MODE = "start vLLM >= 0.32 with VLLM_SERVER_DEV_MODE=1 in its environment (a run that launches it does)"


# ------------------------------------------------------------------------------------------
# The trainer's side: save a version, push it, prune.
# ------------------------------------------------------------------------------------------


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

    ``kind="vllm"``: vLLM's own routes instead (``vllm_update_weights_sync``), always paused in
    ``abort`` mode whatever ``pause`` says: that pause also clears vLLM's KV and prefix caches,
    which would otherwise keep serving what the old weights computed.
    """
    skipped = []
    for url in urls:
        try:
            if kind == "vllm":
                vllm_update_weights_sync(url, model_dir, version, timeout_s=timeout_s)
            else:
                update_weights_from_disk_sync(url, model_dir, version, pause=pause, timeout_s=timeout_s)
        except EngineUnavailable as e:  # refused, reset, timeout: name the engine and version
            cause = e.__cause__ if isinstance(e.__cause__, OSError) else e
            if _unreachable(cause) and len(urls) > 1:
                print(f"[trainer] {url} cannot be reached ({cause}); v{version} skipped there", file=sys.stderr, flush=True)
                skipped.append(url)
                continue
            raise WeightUpdateError(f"{url}: update to v{version} failed: {cause}") from e
        except EngineError as e:
            raise WeightUpdateError(f"{url}: update to v{version} failed: {e}") from e
    if urls and len(skipped) == len(urls):
        raise WeightUpdateError(f"no engine could be reached for v{version}: {urls}")
    return skipped


def _unreachable(e: BaseException) -> bool:
    """Nothing listens there (or it went away mid-request), as opposed to an answer or a timeout."""
    reason = e.reason if isinstance(e, urllib.error.URLError) and not isinstance(e, urllib.error.HTTPError) else e
    return isinstance(reason, (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected))


def prune_versions(weights_dir: Path, version: int, keep: int) -> None:
    """Delete weight dirs v{k} with k <= version - keep (engines already serve ``version``)."""
    for path in weights_dir.glob("v*"):
        k = path.name[1:]
        if k.isdigit() and int(k) <= version - keep:
            shutil.rmtree(path)


# ------------------------------------------------------------------------------------------
# The engine's side: one server loads a version, blocking (standard library only).
# ------------------------------------------------------------------------------------------


def update_weights_from_disk_sync(
    base_url: str,
    model_path: str | os.PathLike,
    weight_version: str | int | None,
    *,
    pause: bool = False,
    api_key: str | None = None,
    timeout_s: float = 600,
) -> None:
    """Load ``model_path`` into one server of SGLang's protocol as ``weight_version``; with
    ``pause``, between ``/pause_generation`` (abort) and ``/continue_generation`` (see
    ``push_weights``). Raises ``EngineError`` unless the server confirms, ``EngineUnavailable``
    when nothing answers."""

    def post(path: str, body: dict[str, Any]) -> Any:
        return request_json(base_url, path, body, timeout_s, api_key=api_key)

    if pause:
        post("/pause_generation", {"mode": "abort"})
    try:
        answer = post("/update_weights_from_disk", update_body(model_path, weight_version))
    finally:
        if pause:
            post("/continue_generation", {})
    check_update(answer)


def check_weight_dir(path: str | os.PathLike) -> None:
    """Refuse a dir without weight files before anything is paused: vLLM's in-place reload from
    it would leave the model on meta tensors, and its engine dies on the next step."""
    p = Path(path)
    if not p.is_dir() or not (any(p.glob("*.safetensors")) or any(p.glob("*.bin"))):
        raise EngineError(400, f"{path}: not a checkpoint dir with *.safetensors or *.bin files on this machine")


def vllm_update_weights_sync(
    base_url: str,
    model_dir: str | os.PathLike,
    weight_version: str | int | None,
    *,
    api_key: str | None = None,
    timeout_s: float = 600,
) -> None:
    """Load ``model_dir`` (an HF checkpoint dir) into one vLLM server as ``weight_version``.

    Pause with ``abort`` (running requests end with the tokens they have, which ``VLLMClient``
    resubmits after the resume, and vLLM's KV and prefix caches are cleared, so no KV of the old
    weights is reused), reload in place, set the version, resume. A server the caller already
    paused is paused again with ``abort`` (for the cache) and left paused. Raises ``EngineError`` on an error answer
    (a 404 names the missing ``VLLM_SERVER_DEV_MODE=1``), ``EngineUnavailable`` when nothing answers.
    """
    check_weight_dir(model_dir)

    def call(path: str, body: Any = None, method: str = "POST") -> Any:
        return request_json(base_url, path, body, timeout_s, method=method, api_key=api_key, server="vLLM", needs=VLLM_NEEDS_DEV_MODE)

    already_paused = bool(call("/is_paused", method="GET")["is_paused"])
    call("/pause?mode=abort")
    try:
        call("/collective_rpc", {"method": "reload_weights", "kwargs": {"weights_path": str(model_dir)}})
        if weight_version is not None:
            call("/update_weight_version", {"new_version": str(weight_version)})
    finally:
        if not already_paused:
            call("/resume")
