"""The trajectory hop (areal/ring/remote.py): real TCP sockets, real shared-memory rings.

Records are ``ring_remote_peer.trajectory_for(i)``, a function of ``i`` alone, so the reader checks
every byte of every record against a fresh encoding. Receivers that must die run as
subprocesses (``ring_remote_peer.py receiver``) killed with SIGKILL; the rest run on a thread of
this process. The last test puts receiver and sender in two network namespaces joined by a veth
pair (root only), so the hop crosses a real (virtual) link between two network stacks.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import msgspec
import pytest
import zmq
from paths import SUPPORT
from ring_remote_peer import trajectory_for

from areal.protocol import HopAck, HopHello, HopOutbound, HopRecord, HopRefused, encode_trajectory
from areal.ring.buffer import SHM_DIR, RingError, RingReader, RingWriter, record_bytes, ring_name
from areal.ring.layout import digest
from areal.ring.remote import HopTimeout, TrajectoryReceiver, TrajectoryRefused, TrajectorySender

PEER = str(SUPPORT / "ring_remote_peer.py")
_counter = itertools.count()


@pytest.fixture
def name():
    n = ring_name(f"hop{os.getpid()}x{next(_counter)}", 0)
    yield n
    for e in os.listdir(SHM_DIR):
        if n in e:
            os.unlink(os.path.join(SHM_DIR, e))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _drain(reader: RingReader, got: list[bytes], want: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while len(got) < want:
        rec = reader.get(timeout_s=max(0.0, min(0.2, deadline - time.monotonic())))
        if rec is not None:
            got.append(rec)
        elif time.monotonic() >= deadline:
            break


def _check_records(got: list[bytes], count: int) -> None:
    ids = [msgspec.msgpack.decode(r)[1] for r in got]  # episode_id: the Trajectory is array_like
    assert ids == [f"ep{i}" for i in range(count)], "records missing, duplicated or out of order"
    for i, rec in enumerate(got):
        assert rec == encode_trajectory(trajectory_for(i)), f"record {i} differs"


def _line(proc: subprocess.Popen, timeout_s: float = 20) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"no output from {proc.args} in {timeout_s}s"
    return proc.stdout.readline().strip()


def test_records_arrive_in_order_and_intact(name):
    with RingWriter(name, 4 << 20) as writer, TrajectoryReceiver("tcp://127.0.0.1:0", writer).start() as receiver:
        assert receiver.address.startswith("tcp://127.0.0.1:")
        with RingReader(name) as reader, TrajectorySender(receiver.address, window=8) as sender:
            got: list[bytes] = []
            for i in range(200):
                assert sender.put(trajectory_for(i), timeout_s=10) == i
                _drain(reader, got, len(got) + 1, 0)
            sender.flush(timeout_s=10)
            assert sender.unacked == 0
            _drain(reader, got, 200, 10)
        _check_records(got, 200)
        assert (receiver.written, receiver.duplicates, receiver.refused) == (200, 0, 0)


def _ring_with_its_reader(name: str) -> RingReader:
    """A ring that outlives its receivers (each attaches as its writer), with the trainer side's
    reader attached at once: a ring with neither end alive is what a starting run reclaims as stale
    (``reclaim_stale``), and runs of other tests start beside this one."""
    RingWriter(name, 8 << 20).close()
    return RingReader(name)


def test_receiver_killed_and_restarted_writes_each_record_once(name, tmp_path):
    ring = _ring_with_its_reader(name)
    bind = f"tcp://127.0.0.1:{_free_port()}"
    journal = tmp_path / "hop.journal"

    def start() -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, PEER, "receiver", name, bind, str(journal)], stdout=subprocess.PIPE, text=True)
        assert _line(proc) == f"READY {bind}"
        return proc

    rng = random.Random(25)
    count, kills = 300, {40, 90, 150, 151, 220}
    proc = start()
    got: list[bytes] = []
    try:
        with ring as reader, TrajectorySender(bind, window=16, resend_s=2) as sender:
            for i in range(count):
                sender.put(trajectory_for(i), timeout_s=30)
                _drain(reader, got, len(got) + 1, 0)
                if i in kills:
                    time.sleep(rng.random() * 0.005)  # somewhere inside the receiver's loop
                    proc.kill()
                    proc.wait(timeout=10)
                    proc = start()
            sender.flush(timeout_s=30)
            _drain(reader, got, count, 30)
            time.sleep(0.3)  # a duplicate would arrive now, if any were in flight
            _drain(reader, got, count + 1, 0.2)
            assert sender.reconnects >= len(kills) - 1  # 150 and 151: the sender may never have seen the 150th up
    finally:
        proc.kill()
        proc.wait(timeout=10)
    _check_records(got, count)


def test_corrupted_record_is_refused_and_never_written(name):
    with RingWriter(name, 1 << 20) as writer, TrajectoryReceiver("tcp://127.0.0.1:0", writer).start() as receiver:
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.RCVTIMEO, 10_000)
        sock.connect(receiver.address)
        enc, dec = msgspec.msgpack.Encoder().encode, msgspec.msgpack.Decoder(HopOutbound)
        try:
            sock.send(enc(HopHello("raw", 0)))
            assert dec.decode(sock.recv()) == HopAck("raw", -1)
            payload = encode_trajectory(trajectory_for(0))
            damaged = payload[:100] + bytes([payload[100] ^ 1]) + payload[101:]  # one bit flipped after the digest
            sock.send_multipart((enc(HopRecord("raw", 0, digest(payload))), damaged))
            reply = dec.decode(sock.recv())
            assert isinstance(reply, HopRefused) and reply.seq == 0 and "checksum mismatch" in reply.error
            assert writer.next_seq == 0 and receiver.written == 0 and receiver.refused == 1
            sock.send_multipart((enc(HopRecord("raw", 0, digest(payload))), payload))  # the intact record is taken
            assert dec.decode(sock.recv()) == HopAck("raw", 0)
            assert writer.next_seq == 1
        finally:
            sock.close(linger=0)
            ctx.term()


def test_sender_raises_on_refusal():
    """A stand-in receiver speaking the real protocol refuses record 0: the sender says so."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind("tcp://127.0.0.1:0")
    router.setsockopt(zmq.RCVTIMEO, 10_000)
    enc, dec = msgspec.msgpack.Encoder().encode, msgspec.msgpack.Decoder(HopHello | HopRecord)
    sender = TrajectorySender(router.getsockopt_string(zmq.LAST_ENDPOINT))
    try:
        sender.put(trajectory_for(0))
        deadline = time.monotonic() + 10
        while True:  # the Hello, then the record
            try:
                sender.flush(timeout_s=0.05)
            except HopTimeout:
                pass
            if router.poll(0):
                identity, header, *_ = router.recv_multipart()
                if isinstance(dec.decode(header), HopRecord):
                    break
            assert time.monotonic() < deadline, "the record never came"
        router.send_multipart((identity, enc(HopRefused(sender.sender_id, 0, "checksum mismatch: test"))))
        with pytest.raises(TrajectoryRefused, match="record 0 .* refused: checksum mismatch"):
            sender.flush(timeout_s=10)
    finally:
        sender.close(timeout_s=0)
        router.close(linger=0)
        ctx.term()


def test_full_ring_stops_acks_and_the_sender_window(name):
    """No reader: the ring fills, the receiver stops acking, the sender's window fills and
    ``put`` times out without taking the record. A reader then drains everything, in order."""
    with RingWriter(name, 512 << 10) as writer, TrajectoryReceiver("tcp://127.0.0.1:0", writer).start() as receiver:
        with TrajectorySender(receiver.address, window=4) as sender:
            sent = 0
            with pytest.raises(HopTimeout, match="the window is full"):
                for sent in range(200):
                    sender.put(trajectory_for(sent), timeout_s=1)
            assert 0 < sent < 200 and sender.unacked == 4
            assert receiver.full_waits > 0 and writer.next_seq == receiver.written < sent
            # full, not merely slow: the next record does not fit (the end of a lap may waste up to its size)
            assert writer.free_bytes() < 2 * record_bytes(len(encode_trajectory(trajectory_for(receiver.written))))
            got: list[bytes] = []
            with RingReader(name) as reader:  # the trainer rank, on a thread: it drains while put waits
                drainer = threading.Thread(target=_drain, args=(reader, got, sent + 20, 20))
                drainer.start()
                for i in range(sent, sent + 20):
                    sender.put(trajectory_for(i), timeout_s=10)
                sender.flush(timeout_s=10)
                drainer.join()
    _check_records(got, sent + 20)


def _sh(*cmd: str) -> None:
    subprocess.run(cmd, check=True, capture_output=True, timeout=20)


@pytest.fixture
def two_hosts():
    """Network namespaces A (10.199.0.1) and B (10.199.0.2) joined by a veth pair; removed after.
    Yields (A, B, the name of A's end of the pair)."""
    if os.geteuid() != 0 or shutil.which("ip") is None:
        pytest.skip("needs root and iproute2 to make network namespaces")
    tag = f"{os.getpid() % 100000}{next(_counter)}"
    a, b = f"arl-a{tag}", f"arl-b{tag}"
    try:
        _sh("ip", "netns", "add", a)
        _sh("ip", "netns", "add", b)
        _sh("ip", "link", "add", f"va{tag}", "netns", a, "type", "veth", "peer", "name", f"vb{tag}", "netns", b)
        for ns, dev, ip in ((a, f"va{tag}", "10.199.0.1/30"), (b, f"vb{tag}", "10.199.0.2/30")):
            _sh("ip", "-n", ns, "addr", "add", ip, "dev", dev)
            _sh("ip", "-n", ns, "link", "set", dev, "up")
            _sh("ip", "-n", ns, "link", "set", "lo", "up")
    except subprocess.CalledProcessError as e:
        for ns in (a, b):
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        pytest.skip(f"cannot make network namespaces here: {e.stderr.decode().strip()}")
    yield a, b, f"va{tag}"
    for ns in (a, b):  # deleting a namespace deletes its end of the veth pair, and so the pair
        subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=20)


@contextlib.contextmanager
def _peers_in(a: str, b: str, name: str, bind: str, journal: Path, *send: str) -> Iterator[tuple[subprocess.Popen, subprocess.Popen]]:
    """(receiver, sender): a receiver peer in namespace ``a`` onto ring ``name``, bound at ``bind``
    with its journal at ``journal``, once it is ready, and a sender peer in namespace ``b`` to it
    (``send``: its count and optional delay); on leaving, each is killed if it still runs."""
    procs: list[subprocess.Popen] = []
    try:
        receiver = subprocess.Popen(
            ["ip", "netns", "exec", a, sys.executable, PEER, "receiver", name, bind, str(journal)], stdout=subprocess.PIPE, text=True
        )
        procs.append(receiver)
        assert _line(receiver) == f"READY {bind}"
        procs.append(
            subprocess.Popen(["ip", "netns", "exec", b, sys.executable, PEER, "sender", bind, *send], stdout=subprocess.PIPE, text=True)
        )
        yield receiver, procs[1]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)


def test_hop_between_two_network_namespaces(name, tmp_path, two_hosts):
    a, b, _ = two_hosts
    ring = _ring_with_its_reader(name)
    bind = "tcp://10.199.0.1:5701"
    with _peers_in(a, b, name, bind, tmp_path / "j", "120") as (receiver, sender):
        got: list[bytes] = []
        with ring as reader:  # the trainer side: the root namespace shares /dev/shm with A
            _drain(reader, got, 120, 60)
        assert _line(sender, 30).startswith("DONE")
        receiver.send_signal(signal.SIGTERM)
        assert receiver.wait(timeout=10) == 0
    _check_records(got, 120)


def test_journal_replay_lets_the_ring_decide_the_last_write(name, tmp_path):
    """The journal's last line is an intent; the ring's next seq says whether it landed."""
    journal = tmp_path / "hop.journal"
    with RingWriter(name, 1 << 20) as writer:
        writer.put(b"r0")
        writer.put(b"r1")  # ring next seq: 2
        journal.write_text("a 0 0\na 1 1\nb 5 -1\na 2 2\n")  # a's seq 2 was about to become ring seq 2
        with TrajectoryReceiver("tcp://127.0.0.1:0", writer, journal_path=str(journal)) as receiver:
            assert receiver.hwm == {"a": 1, "b": 5}
        assert journal.read_text() == "a 1 -1\nb 5 -1\n"  # compacted
        journal.write_text("a 1 -1\nb 5 -1\na 2 1\n")  # a's seq 2 is ring seq 1, which exists
        with TrajectoryReceiver("tcp://127.0.0.1:0", writer, journal_path=str(journal)) as receiver:
            assert receiver.hwm == {"a": 2, "b": 5}
        journal.write_text("a 0 7\nb 5 -1\n")  # names a ring seq this ring never had
        with pytest.raises(RingError, match="another ring or run"):
            TrajectoryReceiver("tcp://127.0.0.1:0", writer, journal_path=str(journal))


def test_hop_messages_round_trip_through_their_socket_decoders():
    enc = msgspec.msgpack.Encoder().encode
    inbound, outbound = msgspec.msgpack.Decoder(HopHello | HopRecord), msgspec.msgpack.Decoder(HopOutbound)
    for msg in (HopHello("w-1", 7), HopRecord("w-1", 7, (1 << 64) - 1)):  # the digest is a full u64
        assert inbound.decode(enc(msg)) == msg
    for msg in (HopAck("w-1", -1), HopRefused("w-1", 3, "checksum mismatch")):
        assert outbound.decode(enc(msg)) == msg
    with pytest.raises(msgspec.ValidationError):  # each socket's decoder takes only its own side's messages
        outbound.decode(enc(HopHello("w-1", 0)))


def test_link_cut_long_enough_for_the_heartbeat_then_restored(name, tmp_path, two_hosts):
    """The veth link goes down mid-stream for longer than the heartbeat timeout (5 s): both ends
    drop the connection; when the link comes back the sender reconnects, says Hello and resends
    what was not acked. Every record arrives once."""
    a, b, dev = two_hosts
    ring = _ring_with_its_reader(name)
    bind, count = "tcp://10.199.0.1:5702", 150
    with _peers_in(a, b, name, bind, tmp_path / "j", str(count), "0.02") as (receiver, sender):
        got: list[bytes] = []
        with ring as reader:
            _drain(reader, got, 30, 30)
            _sh("ip", "-n", a, "link", "set", dev, "down")
            _drain(reader, got, count, 7)  # what was in flight, then nothing: the link is down
            cut_at = len(got)
            _sh("ip", "-n", a, "link", "set", dev, "up")
            _drain(reader, got, count, 60)
        assert 30 <= cut_at < count, "the cut came too late to interrupt the stream"
        done = _line(sender, 30)
        assert done.startswith("DONE") and int(done.split()[1]) >= 1, done  # it reconnected
        receiver.send_signal(signal.SIGTERM)
        assert receiver.wait(timeout=10) == 0
    _check_records(got, count)


class _Tap:
    """A TCP relay between sender and receiver that keeps every byte it carries (what a wire sniffer sees)."""

    def __init__(self, target: str) -> None:
        host, port = target.removeprefix("tcp://").rsplit(":", 1)
        self.target = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"tcp://127.0.0.1:{self.server.getsockname()[1]}"
        self.seen = bytearray()
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                down, _ = self.server.accept()
            except OSError:  # closed
                return
            up = socket.create_connection(self.target)
            for a, b in ((down, up), (up, down)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(1 << 16):
                with self.lock:
                    self.seen += data
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                s.close()

    def close(self) -> None:
        self.server.close()


@pytest.mark.parametrize("encrypted", [False, True])
def test_curve_keys_encrypt_the_hop_end_to_end(name, encrypted):
    """Through a tap on the wire: without keys the records' bytes cross in clear; with the run's
    CURVE keys (areal/curve.py) none of them does, and every record still lands intact, in order."""
    from areal.curve import CurveKeys

    keys = CurveKeys.generate() if encrypted else None
    with RingWriter(name, 4 << 20) as writer, TrajectoryReceiver("tcp://127.0.0.1:0", writer, keys=keys).start() as receiver:
        tap = _Tap(receiver.address)
        try:
            with RingReader(name) as reader:
                with TrajectorySender(tap.address, window=8, keys=keys.client_side() if keys else None) as sender:
                    for i in range(20):
                        sender.put(trajectory_for(i), timeout_s=30)
                    sender.flush(timeout_s=30)
                got: list[bytes] = []
                _drain(reader, got, 20, 10)
        finally:
            tap.close()
    _check_records(got, 20)
    marker = b"ep17"  # the episode id inside record 17: plain bytes of the payload
    with tap.lock:
        assert (marker in tap.seen) is not encrypted
        assert (encode_trajectory(trajectory_for(3))[:64] in tap.seen) is not encrypted


def test_a_sender_without_the_runs_client_key_delivers_nothing(name):
    """A CURVE receiver admits only the run's client key: a sender with another run's keys (or
    none) gets no handshake, its records time out unacked, and nothing reaches the ring."""
    from areal.curve import CurveKeys

    keys, other = CurveKeys.generate(), CurveKeys.generate()
    stranger = CurveKeys(keys.server_public, other.client_public, other.client_secret)  # knows the server, not the client key
    with RingWriter(name, 4 << 20) as writer, TrajectoryReceiver("tcp://127.0.0.1:0", writer, keys=keys).start() as receiver:
        for sender_keys in (stranger, None):
            sender = TrajectorySender(receiver.address, window=4, keys=sender_keys)
            try:
                sender.put(trajectory_for(0), timeout_s=5)
                with pytest.raises(HopTimeout):
                    sender.flush(timeout_s=2)
            finally:
                sender.close(timeout_s=0)
        assert receiver.written == 0 and writer.next_seq == 0
        with TrajectorySender(receiver.address, window=4, keys=keys.client_side()) as sender:  # the run's own sender
            sender.put(trajectory_for(0), timeout_s=5)
            sender.flush(timeout_s=10)
        assert receiver.written == 1
