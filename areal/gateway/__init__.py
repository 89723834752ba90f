"""The token-tracking gateway: see ``core`` for the request core and its invariants.

Modules: ``contract`` (types the front-ends and the core exchange), ``core`` (config, sessions,
the request core), ``render`` (incremental prompt ids), ``template`` (the chat template as the
gateway renders it), ``generation`` (engine calls, stop strings, streaming, recording), ``tree``
(conversation tree, rewards, export), ``chat`` / ``responses`` / ``anthropic`` (API front-ends;
``sse``: the event streams of the latter two),
``parsers`` / ``toolcalls`` / ``harmony`` (tool-call and reasoning formats), ``structured``
(response formats and forced calls as the engine's constraint), ``families`` (what a
model family's tokenizer tells: ``tool_parser=auto``, stop tokens, decoding), ``qwen`` (offline
tokenizers for tests), ``routes`` (routing, auth, error shapes), ``server`` (ZeroMQ and HTTP doors),
``standalone`` (the gateway alone, ``python -m areal.gateway``: one long-lived session, calls recorded for the viewer).
"""

from areal.gateway.core import (
    Gateway,
    GatewayConfig,
    Interaction,
    RequestError,
    Session,
)
from areal.gateway.server import serve_http, serve_zmq
from areal.gateway.tree import InteractionWithTokenLogpReward

__all__ = [
    "Gateway",
    "GatewayConfig",
    "Interaction",
    "InteractionWithTokenLogpReward",
    "RequestError",
    "Session",
    "serve_http",
    "serve_zmq",
]
