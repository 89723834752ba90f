"""The token-tracking gateway: see ``core`` for the request core and its invariants.

Modules: ``core`` (sessions, routing, the request core, ZeroMQ and HTTP front doors).
"""

from areal.gateway.core import (
    Gateway,
    GatewayConfig,
    Interaction,
    RequestError,
    Session,
    serve_http,
    serve_zmq,
)

__all__ = ["Gateway", "GatewayConfig", "Interaction", "RequestError", "Session", "serve_http", "serve_zmq"]
