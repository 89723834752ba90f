"""Blocking JSON-over-HTTP calls for tests that talk to a server directly (engine, weight sync):
the status and the decoded body, error statuses included (no exception for a 4xx/5xx)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request


def post(url: str, body: object) -> tuple[int, object]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def get(url: str) -> tuple[int, object]:
    with urllib.request.urlopen(url, timeout=60) as resp:
        return resp.status, json.loads(resp.read())
