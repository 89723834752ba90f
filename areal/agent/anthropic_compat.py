"""AReaL's Anthropic agents on the anthropic SDK pinned here: the sampling keywords given back.

anthropic 1.0 took ``temperature``, ``top_p`` and ``top_k`` out of ``messages.create`` and
``messages.stream``; AReaL's Anthropic agents (and code written for the 0.x SDK) still pass them,
and get a ``TypeError`` before any request is sent. The Messages API still takes the three fields,
and so does the gateway. ``accept_sampling_keywords`` wraps those methods (sync and async) of an
SDK that lacks the keywords, so that they travel in the request body (``extra_body``, where a value
the caller put there wins), as the 0.x SDK sent them. An SDK that has them is left as it is.

Applied where the runners prepare the SDKs an episode uses (``httpx2_bridge.install``: when
anthropic is imported, or at once when it is already), so a sandboxed or inline agent gets it
unchanged. Not covered: ``client.beta.messages`` (AReaL's agents do not use it).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

SAMPLING = ("temperature", "top_p", "top_k")


def accept_sampling_keywords(anthropic: Any) -> None:
    """Wrap ``messages.create`` / ``messages.stream`` of the ``anthropic`` module's clients when they
    lack the sampling keywords (idempotent)."""
    from anthropic.resources import messages

    for cls in (messages.Messages, messages.AsyncMessages):
        for name in ("create", "stream"):
            method = getattr(cls, name, None)
            if method is None or getattr(method, "_areal_sampling", False):
                continue
            missing = [k for k in SAMPLING if k not in inspect.signature(method).parameters]
            if missing:
                setattr(cls, name, _sending_in_body(method, missing))


def _sending_in_body(method: Callable[..., Any], keywords: list[str]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        sampling = {k: kwargs.pop(k) for k in keywords if k in kwargs}
        if sampling:
            kwargs["extra_body"] = {**sampling, **(kwargs.get("extra_body") or {})}
        return method(self, *args, **kwargs)

    call._areal_sampling = True  # type: ignore[attr-defined]
    return call
