"""CURVE on the ZeroMQ TCP hops between nodes: encrypted, and only the run's own peers admitted.

    controller (one run)            CurveKeys.generate(): a server pair and a client pair (Z85)
      ├─ trainer node's TrajectoryReceivers   serve_curve: server pair; ZAP admits only the client key
      │     ◄── TrajectorySenders (controller) connect_curve: client pair + the server's public key
      └─ the controller's report socket        serve_curve
            ◄── every trainer rank's Reporter   connect_curve (keys from AREAL_CURVE_KEYS)

With ``cluster.encrypt`` (the default with ``cluster.kind=ray``), a run draws one set of keys and
hands them out over Ray's control calls (the TrainerHost actors get the server side, the
controller keeps the client side for its senders) and to the trainer's processes in their
environment (``AREAL_CURVE_KEYS``: the client side only, never written to the run directory).
Each server socket runs a ZAP handler (pyzmq's ``ThreadAuthenticator``) that admits a connection
only when it proves the run's client key, so a process that can reach the port but holds no key
(another run, a stray client) gets no handshake, and every byte on the wire is encrypted
(CurveZMQ: Curve25519 key exchange, XSalsa20-Poly1305 per message).

Not covered here: Ray's own control plane (Ray's token authentication and ``RAY_USE_TLS``), the
gateway's HTTP calls to the engines (SGLang and vLLM serve plain HTTP), and the controller's
``tcp://`` gateway door of ``cluster.gateway=controller`` (its bytes are the sandbox relay's own
ZMTP stream, carried as is).
"""

from __future__ import annotations

import dataclasses
import json
import os

import zmq

ENV = "AREAL_CURVE_KEYS"  # the client side of a run's keys, for the trainer's processes


@dataclasses.dataclass(frozen=True)
class CurveKeys:
    """One run's CURVE keys, Z85 text. A connecting side holds ``client_side()`` (no server secret)."""

    server_public: str
    client_public: str
    client_secret: str
    server_secret: str = ""

    @classmethod
    def generate(cls) -> CurveKeys:
        if not zmq.has("curve"):
            raise RuntimeError("this libzmq has no CURVE support: set cluster.encrypt=false, or install a pyzmq built with libsodium")
        server_public, server_secret = zmq.curve_keypair()
        client_public, client_secret = zmq.curve_keypair()
        return cls(server_public.decode(), client_public.decode(), client_secret.decode(), server_secret.decode())

    def client_side(self) -> CurveKeys:
        return dataclasses.replace(self, server_secret="")

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> CurveKeys:
        return cls(**json.loads(text))

    @classmethod
    def from_env(cls) -> CurveKeys | None:
        text = os.environ.get(ENV)
        return cls.from_json(text) if text else None


class _OnlyClient:
    """ZAP's credentials provider: admits exactly one client public key."""

    def __init__(self, public: str) -> None:
        self.public = public.encode()

    def callback(self, domain: str, key: bytes) -> bool:  # key: Z85, as pyzmq's authenticator passes it
        return key == self.public


def serve_curve(sock: zmq.Socket, keys: CurveKeys) -> object:
    """Make ``sock`` (before it binds) a CURVE server admitting only ``keys``' client; returns the
    ZAP handler running on its context, to ``stop()`` when the socket is closed."""
    from zmq.auth.thread import ThreadAuthenticator

    if not keys.server_secret:
        raise ValueError("serve_curve needs the server's secret key (these keys are a client's side)")
    context = sock.context if type(sock.context) is zmq.Context else zmq.Context.shadow(sock.context.underlying)
    auth = ThreadAuthenticator(context, log=None)
    auth.start()
    auth.configure_curve_callback(domain="*", credentials_provider=_OnlyClient(keys.client_public))
    sock.curve_secretkey = keys.server_secret.encode()
    sock.curve_publickey = keys.server_public.encode()
    sock.curve_server = True
    return auth


def connect_curve(sock: zmq.Socket, keys: CurveKeys) -> None:
    """Make ``sock`` (before it connects) a CURVE client of the server ``keys`` name."""
    sock.curve_secretkey = keys.client_secret.encode()
    sock.curve_publickey = keys.client_public.encode()
    sock.curve_serverkey = keys.server_public.encode()
