"""Routing of one HTTP exchange: authentication, the front-ends, rewards, admin, error shapes.

    POST /v1/chat/completions   session key   chat.handle
    POST /v1/completions        session key   completions.handle (a prompt the client wrote; no template)
    POST /v1/responses          session key   responses.handle
    POST /v1/messages           session key   anthropic.handle (errors in Anthropic's shape, as on
                                              every path under /v1/messages/)
    POST /v1/messages/count_tokens session key anthropic.count_tokens -> {"input_tokens": N}
    GET  /v1/models             session key
    POST /v1/rewards            session key   {"interaction_id"?: str, "reward": number}
                                              (no id: the session's last interaction)
    GET  /v1/interactions/{id}  session key   that interaction's ids, logprobs, reward, parent
    GET  /health                none
    POST /admin/sessions        admin key     {"episode_id"} -> {"key"}
    POST /admin/sessions/close  admin key     {"key"} -> the session with its interactions
    GET  /admin/sessions        admin key     live and expired sessions (expired are reported)
    GET  /admin/metrics         admin key     counters, drift included

The session key may also be the URL's: ``/sessions/<key>/v1/...`` is ``/v1/...`` with that key
(AReaL, rLLM and others put the session in the base URL, so agents that send no key, or a
hard-coded placeholder, still reach their own session). A key in the path wins over the headers;
it is the same secret, so this opens nothing a header key does not. An SDK that appends its own
``/v1`` to such a base URL (Anthropic's) gets ``/v1/v1/...``, read as ``/v1/...``.

Invariants: a session key resolves to its own session only, so another session's interaction
ids are simply not found (404) — never read or rewarded. Keys are compared in constant time.
Every exception a client can cause becomes a Reply here; the server loops never see one. That
includes nesting: JSON nested deeper than the decoder's recursion limit (~1,000 levels) is a 400,
and so is a RecursionError from anything that walks a request later (templates, hashing).
"""

from __future__ import annotations

import hmac
from typing import TYPE_CHECKING, Any

import msgspec

from areal.engine.client import EngineError, EngineUnavailable
from areal.gateway import anthropic, branching, chat, completions, responses
from areal.gateway.contract import Reply, RequestError
from areal.protocol import GatewayRequest

if TYPE_CHECKING:
    from areal.gateway.core import Gateway, Session

_FRONT_ENDS = {
    "/v1/chat/completions": chat.handle,
    "/v1/completions": completions.handle,
    "/v1/responses": responses.handle,
    "/v1/messages": anthropic.handle,
    "/v1/messages/count_tokens": anthropic.count_tokens,
}
_ANTHROPIC_ROOT = "/v1/messages"
# the same routes under a base URL without /v1 (a client given the gateway's root, as AReaL's online examples do)
_BARE = {p.removeprefix("/v1") for p in (*_FRONT_ENDS, "/v1/models", "/v1/rewards")}
_ENGINE_CLIENT_ERRORS = range(400, 500)


def openai_error(status: int, message: str, kind: str, param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error shape; ``code`` is its machine-readable reason (e.g. "context_length_exceeded")."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


SESSION_PATH = "/sessions/"


def split_session_path(raw_path: str) -> tuple[str | None, str]:
    """``(key, path)``: the key named by a ``/sessions/<key>/...`` prefix (else None) and the
    route's path without it, its query and a trailing ``/``; a route named without its ``/v1``
    (``/chat/completions``: a client given the gateway's root as its base URL) gets it."""
    path = raw_path.split("?", 1)[0].rstrip("/")
    if not path.startswith(SESSION_PATH):
        return None, "/v1" + path if path in _BARE else path
    key, _, rest = path[len(SESSION_PATH) :].partition("/")
    rest = "/" + rest
    if rest.startswith("/v1/v1/") or rest == "/v1/v1":
        rest = rest[3:]
    return key, "/v1" + rest if rest in _BARE else rest


async def route(gateway: Gateway, req: GatewayRequest) -> Reply:
    path = split_session_path(req.path)[1]
    try:
        return await _route(gateway, req, path)
    except RequestError as e:
        return error_reply(path, e.status, e.message, e.kind, e.param, e.code)
    except RecursionError:  # a request nested deeper than the code that walks it can recurse
        return error_reply(path, 400, "request is nested too deeply to process", "invalid_request_error")
    except EngineUnavailable as e:
        return error_reply(path, 503, f"inference engine unavailable: {e}", "engine_unavailable")
    except EngineError as e:
        if e.status in _ENGINE_CLIENT_ERRORS:  # the engine refused what the request asked for
            return error_reply(path, 400, f"inference engine refused the request: {e.message}", "invalid_request_error")
        return error_reply(path, 502, f"inference engine error: {e}", "engine_error")


def error_reply(path: str, status: int, message: str, kind: str, param: str | None = None, code: str | None = None) -> Reply:
    """An error in the shape of the API at ``path``: Anthropic's on /v1/messages and every path
    under it (count_tokens, and the 404 / 405 of one this gateway does not serve), OpenAI's elsewhere."""
    if path == _ANTHROPIC_ROOT or path.startswith(_ANTHROPIC_ROOT + "/"):
        body = anthropic.error_body(status, message, _ANTHROPIC_KINDS.get(kind, kind))
    else:
        body = openai_error(status, message, kind, param, code)
    return Reply(status=status, body=body)


_ANTHROPIC_KINDS = {"engine_unavailable": "overloaded_error", "engine_error": "api_error"}


async def _route(gateway: Gateway, req: GatewayRequest, path: str) -> Reply:
    if len(req.body) > gateway.config.max_body_bytes:
        raise RequestError(
            413, f"request body of {len(req.body)} bytes exceeds the limit of {gateway.config.max_body_bytes}", kind="request_too_large"
        )
    handler = _FRONT_ENDS.get(path)
    if handler is not None:
        if req.method != "POST":
            raise RequestError(405, f"{path} takes POST, not {req.method}", kind="invalid_request_error")
        session, body = _session(gateway, req), json_object(req.body)
        order = branching.intercept(gateway, session, path, req.headers, body)  # None unless a branch point (off by default)
        if order is not None:
            return order
        try:
            return await handler(gateway, session, body)
        except branching.BranchOrdered as ordered:  # the call's sample proved it the branch point (by entropy)
            return ordered.reply
    match (req.method, path):
        case ("GET", "/health"):
            return Reply(status=200, body={"status": "ok"})
        case ("GET", "/v1/models"):
            _session(gateway, req)
            return Reply(
                status=200,
                body={"object": "list", "data": [{"id": gateway.config.model_name, "object": "model", "created": 0, "owned_by": "areal"}]},
            )
        case ("POST", "/v1/rewards"):
            return _reward(_session(gateway, req), json_object(req.body))
        case ("GET", _) if path.startswith("/v1/interactions/"):
            session = _session(gateway, req)
            inter = session.interactions.get(path.removeprefix("/v1/interactions/"))
            if inter is None:
                raise RequestError(404, "no such interaction in this session", kind="not_found_error")
            return Reply(status=200, body=msgspec.to_builtins(inter))
        case (_, _) if path.startswith("/admin/"):
            _admin(gateway, req)
            return _admin_route(gateway, req.method, path, req.body)
        case ("POST", "/rl/start_session" | "/rl/set_reward" | "/rl/end_session"):
            return await _online_route(gateway, req, path)
    raise RequestError(404, f"no route for {req.method} {path}", kind="not_found_error")


async def _online_route(gateway: Gateway, req: GatewayRequest, path: str) -> Reply:
    """AReaL's routes of online mode (areal/controller/online.py): sessions of agents that run
    outside the run, started with the admin key, scored and ended with their own key."""
    if gateway.online is None:
        raise RequestError(404, f"{path} serves online mode only (rollout.openai.mode=online)", kind="not_found_error")
    if path == "/rl/start_session":
        _admin(gateway, req)
        return await gateway.online.start(json_object(req.body) if req.body else {})
    session = _session(gateway, req)
    if path == "/rl/set_reward":
        return _reward(session, json_object(req.body))
    return gateway.online.end(session.key)


def json_object(body: bytes) -> dict:
    try:
        obj = msgspec.json.decode(body)
    except (msgspec.DecodeError, UnicodeDecodeError) as e:  # invalid UTF-8 surfaces as the latter
        raise RequestError(400, f"request body is not valid JSON: {e}") from None
    except RecursionError:  # msgspec stops at ~1,000 levels of arrays/objects
        raise RequestError(400, "request body is JSON nested too deeply (the limit is about 1,000 levels)") from None
    if not isinstance(obj, dict):
        raise RequestError(400, "request body must be a JSON object")
    return obj


def request_key(req: GatewayRequest) -> str:
    """The session key a request carries: its URL's (``/sessions/<key>/``), else its header's
    (OpenAI: Authorization: Bearer; Anthropic: x-api-key)."""
    in_path = split_session_path(req.path)[0]
    if in_path:
        return in_path
    auth = req.headers.get("authorization", "")
    return auth[7:].strip() if auth.lower().startswith("bearer ") else req.headers.get("x-api-key", "")


def _session(gateway: Gateway, req: GatewayRequest) -> Session:
    return gateway.session_for(request_key(req))


def _admin(gateway: Gateway, req: GatewayRequest) -> None:
    if not hmac.compare_digest(request_key(req).encode(), gateway.admin_key.encode()):
        raise RequestError(401, "admin routes need the admin key", kind="authentication_error")


def _reward(session: Session, body: dict) -> Reply:
    reward, iid = body.get("reward"), body.get("interaction_id")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)):
        raise RequestError(400, "reward must be a number", param="reward")
    if iid is None:
        if not session.interactions:
            raise RequestError(404, "this session has no interaction to reward yet", kind="not_found_error")
        iid = session.set_final_reward(reward)
    elif not isinstance(iid, str) or iid not in session.interactions:
        raise RequestError(404, "no such interaction in this session", param="interaction_id", kind="not_found_error")
    else:
        session.set_reward(iid, reward)
    return Reply(status=200, body={"interaction_id": iid, "reward": float(reward)})


def _admin_route(gateway: Gateway, method: str, path: str, raw: bytes) -> Reply:
    match (method, path):
        case ("POST", "/admin/sessions"):
            episode = json_object(raw).get("episode_id")
            if not isinstance(episode, str):
                raise RequestError(400, "episode_id must be a string", param="episode_id")
            return Reply(status=200, body={"key": gateway.open_session(episode)})
        case ("POST", "/admin/sessions/close"):
            key = json_object(raw).get("key")
            if not isinstance(key, str) or (key not in gateway.sessions and key not in gateway.expired):
                raise RequestError(404, "no such session", param="key", kind="not_found_error")
            return Reply(status=200, body=session_body(gateway.close_session(key)))
        case ("GET", "/admin/sessions"):
            return Reply(
                status=200,
                body={
                    "live": [{"episode_id": s.episode_id, "interactions": len(s.interactions)} for s in gateway.sessions.values()],
                    "expired": [
                        {"key": s.key, "episode_id": s.episode_id, "interactions": len(s.interactions)} for s in gateway.expired.values()
                    ],
                },
            )
        case ("GET", "/admin/metrics"):
            return Reply(status=200, body=gateway.metrics())
    raise RequestError(404, f"no route for {method} {path}", kind="not_found_error")


def session_body(session: Any) -> dict:
    return {
        "episode_id": session.episode_id,
        "drift": session.drift,
        "expired": session.expired,
        "interactions": [msgspec.to_builtins(i) for i in session.interactions.values()],
    }
