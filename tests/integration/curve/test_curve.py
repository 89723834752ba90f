"""areal/curve.py: the run's CURVE keys on the trainer's report channel (real ZeroMQ over TCP).

The trajectory hop's own CURVE tests (a tap on the wire, a stranger's sender) are in
tests/integration/ring/test_ring_remote.py; a whole run on Ray nodes uses both (cluster.encrypt is on by default).
"""

from __future__ import annotations

import contextlib

import msgspec
import pytest
import zmq

from areal.curve import ENV, CurveKeys, serve_curve
from areal.protocol import TrainerDone, TrainerMessage
from areal.trainer.reports import Reporter, ReportUndelivered


def _pull(keys: CurveKeys) -> tuple[zmq.Context, zmq.Socket, object, str]:
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    auth = serve_curve(pull, keys)
    port = pull.bind_to_random_port("tcp://127.0.0.1")
    return ctx, pull, auth, f"tcp://127.0.0.1:{port}"


@pytest.mark.parametrize("reporter_keys", ["run", "stranger", "none"])
def test_the_report_socket_hears_only_ranks_holding_the_runs_client_key(monkeypatch, reporter_keys):
    keys = CurveKeys.generate()
    other = CurveKeys.generate()
    env = {"run": keys.client_side(), "stranger": CurveKeys(keys.server_public, other.client_public, other.client_secret), "none": None}
    if env[reporter_keys] is None:
        monkeypatch.delenv(ENV, raising=False)
    else:
        monkeypatch.setenv(ENV, env[reporter_keys].to_json())
    ctx, pull, auth, addr = _pull(keys)
    reporter = Reporter(addr, send_timeout_s=3.0)  # a send that cannot queue raises, and is not heard
    try:
        with contextlib.suppress(ReportUndelivered):
            reporter.send(TrainerDone(model_dir="/m", steps=3))
        heard = pull.poll(3000 if reporter_keys == "run" else 1500)
        if reporter_keys == "run":
            assert heard and msgspec.msgpack.Decoder(TrainerMessage).decode(pull.recv()) == TrainerDone(model_dir="/m", steps=3)
        else:
            assert not heard  # no handshake: the message never reached the controller's socket
    finally:
        reporter.close(linger_s=0)
        pull.close(0)
        auth.stop()
        ctx.term()


def test_keys_cross_as_text_and_a_client_side_cannot_serve():
    keys = CurveKeys.generate()
    assert CurveKeys.from_json(keys.to_json()) == keys
    client = keys.client_side()
    assert client.server_secret == "" and client.client_secret == keys.client_secret
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PULL)
    try:
        with pytest.raises(ValueError, match="needs the server's secret key"):
            serve_curve(sock, client)
    finally:
        sock.close(0)
        ctx.term()
