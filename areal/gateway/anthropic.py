"""Placeholder so the gateway core can route to this front-end while it is being written."""

from __future__ import annotations

from typing import Any

from areal.gateway.core import RequestError


async def handle(gateway: Any, session: Any, body: dict) -> Any:
    raise RequestError(404, "this API is not served yet", kind="not_found_error")
