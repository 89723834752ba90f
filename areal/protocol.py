"""Every message that crosses a process boundary, defined once.

Control messages are small, frozen, tagged structs; each socket or pipe has one typed decoder
over the union it may carry, and receivers dispatch with ``match``. Bulk records
(``Trajectory``) are ``array_like`` structs whose token arrays are raw little-endian buffers,
so decoding them is zero-copy (``memoryview`` fields point into the received frame).

Evolution rule: append fields with defaults, never reorder or remove. ``Trajectory`` carries
``schema_version``; a reader accepts any version up to ``TRAJECTORY_SCHEMA``.

Boundaries and what crosses them:

    agent (sandbox relay / httpx transport) --GatewayRequest-->  gateway ROUTER (ipc://)
                                            <--GatewayReply---
    controller --SpawnEpisode/Shutdown--> zygote (stdin pipe)
               <--EpisodeOutcome/ZygoteReady-- zygote (stdout pipe)
    grader process --Grade--> zygote (result pipe; sandbox/grader.py)
    controller --Trajectory (bytes)--> shared-memory ring --> trainer rank
    rollout worker --HopHello/HopRecord + Trajectory--> receiver on the trainer node (TCP)
                   <--HopAck/HopRefused--               (areal/ring/remote.py) --> ring
    trainer    --TrainerReport--> controller (ZeroMQ PUSH/PULL)
"""

from __future__ import annotations

import struct
import time

import msgspec
import numpy as np

# --------------------------------------------------------------------------------------------
# Gateway: an HTTP exchange carried over ZeroMQ (DEALER -> ROUTER), so that the in-sandbox relay,
# the httpx ZeroMQ transport and the gateway's own HTTP server all reach one request core.
# --------------------------------------------------------------------------------------------


class GatewayRequest(msgspec.Struct, frozen=True, tag=True):
    """One HTTP request. Header names are lower-case."""

    request_id: int
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class GatewayReply(msgspec.Struct, frozen=True, tag=True):
    """One HTTP response, or one chunk of a streamed response when ``more`` is true.

    A streamed response is several replies with the same ``request_id``: the first carries the
    status and headers, every one carries a body chunk, and the last has ``more=False``.
    """

    request_id: int
    status: int
    headers: dict[str, str]
    body: bytes
    more: bool = False


GatewayMessage = GatewayRequest | GatewayReply

# Branch points (areal/gateway/branching.py ⇄ sandbox/branch.py), as HTTP headers of the exchange:
BRANCHABLE_HEADER = "x-areal-branchable"  # request: the sender can fork at this call ("1")
BRANCH_REFUSED_HEADER = "x-areal-branch-refused"  # request: the ordered branch point was refused; the value says why
BRANCH_ORDER_HEADER = "x-areal-branch"  # reply: a branch order ({"branch": {"call", "keys"}}), not a completion
BRANCH_REASON_LIMIT = 2000  # characters of a refusal's reason kept

# --------------------------------------------------------------------------------------------
# Controller <-> sandbox zygote (length-prefixed msgpack frames over pipes).
# --------------------------------------------------------------------------------------------


class SpawnEpisode(msgspec.Struct, frozen=True, tag=True):
    """Ask the zygote to fork one sandboxed agent process for one episode."""

    episode_id: str
    data: bytes  # JSON of the dataset row handed to ``agent.run(data, ...)``
    api_key: str  # session-scoped gateway key; the only credential the agent receives
    deadline_s: float
    # A task directory (sandbox/world.py): the episode works in a private copy-on-write view of its
    # base at /workspace, and the grader's verdict on it is the reward. "": no world.
    world: str = ""


class Shutdown(msgspec.Struct, frozen=True, tag=True):
    """Ask the zygote to kill its children and exit."""


class ZygoteReady(msgspec.Struct, frozen=True, tag=True):
    """Sent once the zygote has imported the SDKs and the agent module."""

    pid: int
    agent: str
    isolation: list[str]  # the layers this kernel allows, e.g. ["netns", "pidns", "rlimits"]
    warnings: list[str] = []  # one line per layer that could not be applied
    root: list[str] = []  # what an episode's minimal root exposes, read-only (sandbox/rootfs.py's plan)


class EpisodeOutcome(msgspec.Struct, frozen=True, tag=True):
    """How one sandboxed episode ended.

    status: "ok" (run() returned), "error" (run() raised; ``error`` holds the traceback),
    "timeout" (deadline passed; the process group was killed), "crashed" (died by a signal or
    a non-zero exit without reporting), "oom" (killed by the memory limit).
    failure_class / failure_cause: why it failed ("policy", "agent" or "infrastructure", and the
    exception or status that decided; ``areal/agent/failures.py``), "" while undecided or ok.
    """

    episode_id: str
    status: str
    reward: float | None = None  # a float returned by run()
    rewards_by_id: dict[str, float] = {}  # a {completion_id: reward} dict returned by run()
    error: str = ""
    exit_signal: int | None = None
    exit_code: int | None = None
    wall_s: float = 0.0
    log_tail: str = ""  # the end of a failed episode's log (stdout and stderr), apart from the reason
    failure_class: str = ""
    failure_cause: str = ""
    # Sandboxed episodes: the modules run() imported that the zygote had not preloaded, whether it
    # returned or raised (a new package by its name, a lazy package's submodule by its own; every
    # episode imports them again; sandbox.preload lists them ahead).
    imported: list[str] = []
    # An error run() raised: the qualified names of its exception chain, outermost first, each with
    # its bases' (areal/agent/failures.py's raised_types), for the controller's rollout.failure_classes.
    raised: list[list[str]] = []
    # An episode with a world (sandbox/world.py), from the sandbox, never from the episode: the
    # grader's verdict per check (1.0 passed, 0.0 not), the tripwires it witnessed ("kind: detail",
    # sandbox/grader.py), and how the grading ended ("complete", "timeout", "no verdict: ...").
    checks: dict[str, float] = {}
    tripwires: list[str] = []
    grader: str = ""
    # An episode branched at a model call (sandbox/branch.py): one outcome per branch, in branch
    # order, each its own episode ("<episode id>/b<i>"); where ("call <k> of <episode id>"); and why a
    # branch point the gateway ordered was not taken, or its branches cut short ("" when none).
    branches: list[EpisodeOutcome] = []
    branch_point: str = ""
    branch_refused: str = ""


class Grade(msgspec.Struct, frozen=True, tag=True):
    """A grader process's verdict on one episode's final workspace (sandbox/grader.py -> the zygote).

    verdict: "complete" (the checks ran to their end), "timeout", "no verdict" (the checks' process
    ended without finishing its report), "error" (the grader itself failed; ``detail`` says why)."""

    verdict: str
    checks: dict[str, float] = {}
    tripwires: list[str] = []
    detail: str = ""


ZygoteInbound = SpawnEpisode | Shutdown
ZygoteOutbound = ZygoteReady | EpisodeOutcome

# --------------------------------------------------------------------------------------------
# Trainer -> controller.
# --------------------------------------------------------------------------------------------


class TrainerReport(msgspec.Struct, frozen=True, tag=True):
    """Sent by trainer rank 0 after each optimizer step, once the engine serves ``version``."""

    step: int
    version: int  # policy version the engine now serves
    consumed: int  # trajectories consumed so far (ring sequence numbers are 0..consumed-1)
    metrics: dict[str, float]


class TrainerFailed(msgspec.Struct, frozen=True, tag=True):
    """Sent by a trainer rank that is about to exit because of an error."""

    rank: int
    error: str


class TrainerDone(msgspec.Struct, frozen=True, tag=True):
    """Sent by trainer rank 0 after the last step; ``model_dir`` holds the final HF model."""

    steps: int
    model_dir: str


TrainerMessage = TrainerReport | TrainerFailed | TrainerDone

# --------------------------------------------------------------------------------------------
# Rollout worker -> trainer node: the trajectory hop (areal/ring/remote.py), ZeroMQ over TCP.
# A HopRecord frame is followed by one frame holding the encoded Trajectory (raw bytes).
# --------------------------------------------------------------------------------------------


class HopHello(msgspec.Struct, frozen=True, tag=True):
    """First message on each (re)connection: who sends, and the oldest record it has not seen acked."""

    sender: str
    next_unacked: int


class HopRecord(msgspec.Struct, frozen=True, tag=True):
    """Header of one record; ``digest`` is XXH3-64 of the payload frame that follows."""

    sender: str
    seq: int
    digest: int


class HopAck(msgspec.Struct, frozen=True, tag=True):
    """Every record of ``sender`` up to and including ``through`` is published in the ring."""

    sender: str
    through: int


class HopRefused(msgspec.Struct, frozen=True, tag=True):
    """Record ``seq`` was refused (checksum mismatch, malformed frame); nothing of it was written."""

    sender: str
    seq: int
    error: str


HopInbound = HopHello | HopRecord  # sender -> receiver
HopOutbound = HopAck | HopRefused  # receiver -> sender

# --------------------------------------------------------------------------------------------
# Trajectory: the bulk record, one per finished episode, written into a shared-memory ring.
#
# Schema history (fields are only ever appended, with defaults, so every older record decodes):
#   1: schema_version .. row_rewards, timings, error
#   2: drift, failure_kind, policy_version_start/end, created, interaction_ids, row_turns
#   3: row_parents
#   4: row_forks
# --------------------------------------------------------------------------------------------

TRAJECTORY_SCHEMA = 4
_EMPTY = memoryview(b"")


class Trajectory(msgspec.Struct, array_like=True, gc=False):
    """One finished episode: one or more token rows, each a prompt followed by sampled tokens.

    Token arrays are flat and concatenated over rows; ``row_lens`` splits them. Per token:
    ``input_ids`` int32, ``loss_mask`` uint8 (1 = sampled by the policy, trained on),
    ``logprobs`` float32 (the engine's behaviour logprob where loss_mask is 1, else 0),
    ``versions`` int32 (policy version that sampled the token, -1 for prompt tokens).
    Per row: ``row_rewards`` float32, ``row_turns`` int32 (LLM calls folded into the row),
    ``row_parents`` int32 (the row index of the call this row's prompt extends, -1 for a root:
    the gateway's conversation tree, for per-turn returns; empty when unknown, read as a chain),
    ``row_forks`` int32 (the rows whose children are the branches of one branch point, -1 when the
    branches are roots: an episode branched at a model call, docs/branching.md; empty otherwise).
    All little-endian. The lowest/highest sampling version is derived (``version_span``), not
    stored, so it can never disagree with ``versions``. ``versions`` stays int32 per token (a
    third of an 8k record): a generation can span weight updates, a long run can pass int16's
    32,767 steps, and the trainer consumes int32 without a conversion.
    """

    schema_version: int
    episode_id: str
    group_id: str  # episodes sampled from one prompt share a group; advantages normalise in it
    group_size: int  # how many trajectories of this group the trainer will receive
    reward: float  # episode reward (failed episodes carry 0.0 and a status)
    status: str
    input_ids: memoryview
    loss_mask: memoryview
    logprobs: memoryview
    versions: memoryview
    row_lens: memoryview
    row_rewards: memoryview
    timings: dict[str, float] = {}  # seconds per phase, e.g. {"wall_s": 2.1, "reward_s": 0.01}
    error: str = ""  # human-readable failure reason (traceback tail); "" when the episode is ok
    # ---- schema 2 ----
    drift: int = 0  # times the agent rewrote history, so a call started a new branch
    failure_kind: str = ""  # "" = ok; "policy": a policy failure trained with rollout.policy_failure_reward
    policy_version_start: int = -1  # version the engine served when the episode started; -1 unknown
    policy_version_end: int = -1  # version it served when the episode ended; -1 unknown
    created: float = 0.0  # unix time the record was built; 0.0 = unknown (schema 1)
    interaction_ids: list[str] = []  # per row: the gateway interaction id of the row's last call
    row_turns: memoryview = _EMPTY  # (rows,) int32; empty when unknown (schema 1)
    # ---- schema 3 ----
    row_parents: memoryview = _EMPTY  # (rows,) int32 parent row index, -1 = root; empty when unknown (schema < 3)
    # ---- schema 4 ----
    row_forks: memoryview = _EMPTY  # (forks,) int32 fork rows (-1: the roots are the branches); empty: not branched

    def array(self, field: str) -> np.ndarray:
        """Zero-copy numpy view of one buffer field."""
        return np.frombuffer(getattr(self, field), dtype=_DTYPES[field])

    @property
    def num_tokens(self) -> int:
        return len(self.input_ids) // 4

    def version_span(self) -> tuple[int, int]:
        """(lowest, highest) policy version over sampled tokens; (-1, -1) when none was sampled."""
        sampled = self.array("versions")[self.array("loss_mask") == 1]
        return (int(sampled.min()), int(sampled.max())) if sampled.size else (-1, -1)

    @classmethod
    def from_rows(
        cls,
        *,
        episode_id: str,
        group_id: str,
        group_size: int,
        reward: float,
        status: str,
        rows: list[TokenRow],
        timings: dict[str, float] | None = None,
        error: str = "",
        drift: int = 0,
        failure_kind: str = "",
        policy_version_start: int = -1,
        policy_version_end: int = -1,
        created: float | None = None,
        interaction_ids: list[str] | None = None,
        row_turns: list[int] | None = None,
        row_parents: list[int] | None = None,
        row_forks: list[int] | None = None,
    ) -> Trajectory:
        """Build a record from numpy (or list) rows; ``created`` defaults to now."""
        _check_row_lists(len(rows), interaction_ids=interaction_ids, row_turns=row_turns, row_parents=row_parents)
        if row_forks and (row_parents is None or any(not -1 <= f < len(rows) for f in row_forks)):
            raise ValueError(f"row_forks must name rows (or -1: the roots) of a record with row_parents, got {list(row_forks)}")
        return cls(
            schema_version=TRAJECTORY_SCHEMA,
            episode_id=episode_id,
            group_id=group_id,
            group_size=group_size,
            reward=float(reward),
            status=status,
            input_ids=_concat(rows, "input_ids"),
            loss_mask=_concat(rows, "loss_mask"),
            logprobs=_concat(rows, "logprobs"),
            versions=_concat(rows, "versions"),
            row_lens=_int32([len(r.input_ids) for r in rows]),
            row_rewards=memoryview(np.array([r.reward for r in rows], dtype="<f4").tobytes()),
            timings=timings or {},
            error=error,
            drift=drift,
            failure_kind=failure_kind,
            policy_version_start=policy_version_start,
            policy_version_end=policy_version_end,
            created=time.time() if created is None else created,
            interaction_ids=list(interaction_ids or []),
            row_turns=_int32(row_turns if row_turns is not None else []),
            row_parents=_int32(row_parents if row_parents is not None else []),
            row_forks=_int32(row_forks or []),
        )

    def rows(self) -> list[TokenRow]:
        """Split the flat arrays back into rows (views, no copies)."""
        out, start = [], 0
        ids, mask, lp, ver = (self.array(f) for f in ("input_ids", "loss_mask", "logprobs", "versions"))
        for n, r in zip(self.array("row_lens").tolist(), self.array("row_rewards").tolist()):
            s = slice(start, start + n)
            out.append(TokenRow(ids[s], mask[s], lp[s], ver[s], r))
            start += n
        return out


def _concat(rows: list[TokenRow], name: str) -> memoryview:
    """Field ``name`` of every row, concatenated as its wire dtype."""
    parts = [np.asarray(getattr(r, name), dtype=_DTYPES[name]) for r in rows]
    joined = np.concatenate(parts) if parts else np.zeros(0, _DTYPES[name])
    return memoryview(joined.tobytes())


def _int32(values: list[int]) -> memoryview:
    return memoryview(np.array(values, dtype="<i4").tobytes())


def _check_row_lists(n: int, **lists: list | None) -> None:
    """Each per-row list given (``interaction_ids``, ``row_turns``, ``row_parents``) has one entry
    per row; a parent precedes its child (calls are recorded in order), so the tree has no cycle."""
    for name, values in lists.items():
        if values is not None and len(values) != n:
            raise ValueError(f"{name} has {len(values)} entries for {n} rows")
    parents = lists.get("row_parents")
    if parents is not None and any(not -1 <= p < k for k, p in enumerate(parents)):
        raise ValueError(f"row_parents must name an earlier row or -1, got {list(parents)}")


class TokenRow(msgspec.Struct):
    """One row of a trajectory as numpy arrays (in-process only; never sent as such)."""

    input_ids: np.ndarray  # (T,) int32
    loss_mask: np.ndarray  # (T,) uint8
    logprobs: np.ndarray  # (T,) float32
    versions: np.ndarray  # (T,) int32
    reward: float


_DTYPES = {
    "input_ids": np.dtype("<i4"),
    "loss_mask": np.dtype("u1"),
    "logprobs": np.dtype("<f4"),
    "versions": np.dtype("<i4"),
    "row_lens": np.dtype("<i4"),
    "row_rewards": np.dtype("<f4"),
    "row_turns": np.dtype("<i4"),
    "row_parents": np.dtype("<i4"),
    "row_forks": np.dtype("<i4"),
}

_trajectory_encoder = msgspec.msgpack.Encoder()
_trajectory_decoder = msgspec.msgpack.Decoder(Trajectory)
_FIELDS = Trajectory.__struct_fields__
_HEAD = _FIELDS.index("input_ids")  # fields before the first bulk buffer
_BULK = _FIELDS.index("timings")  # fields from here on are small metadata again
assert 0 < _HEAD < _BULK < len(_FIELDS) and len(_FIELDS) - _BULK < 16 and _HEAD < 16
_BIN16, _BIN32 = struct.Struct(">BH").pack, struct.Struct(">BI").pack  # msgpack bin 16 / bin 32 headers
_SMALL_BUFFER = 256  # buffers below this are copied into the neighbouring part (bin 8 size range)
_encode = _trajectory_encoder.encode
_astuple = msgspec.structs.astuple
_ARRAY_HEADER = bytes([0x90 | len(_FIELDS)]) if len(_FIELDS) < 16 else b"\xdc" + len(_FIELDS).to_bytes(2, "big")


def encode_trajectory(traj: Trajectory) -> bytes:
    return _trajectory_encoder.encode(traj)


class RecordParts(list):
    """Buffers whose concatenation is one record, and their total byte length ``nbytes``.

    ``RingWriter.put_parts`` takes ``nbytes`` instead of measuring every part again (a visible
    share of the per-record budget); it still checks after copying that exactly that many bytes
    were written, before it publishes anything."""

    __slots__ = ("nbytes",)


def encode_trajectory_parts(traj: Trajectory) -> RecordParts:
    """The bytes of ``encode_trajectory(traj)`` as a list of parts, the token buffers uncopied.

    For scatter-gather writers (``RingWriter.put_parts``): the big buffers go straight from the
    caller's arrays into shared memory, saving one full copy of the record. It relies on two
    facts of msgpack: an array is its header followed by its elements' encodings, and ``bin``
    is a header followed by the raw bytes; msgspec writes the smallest header for each, as here
    (a test pins ``b"".join(parts) == encode_trajectory(traj)``). Buffers under 256 bytes are
    copied into the neighbouring part. Its cost is the msgspec calls and the loop, not the token
    count (merging the trailing small buffers into one call was slower).
    """
    values = _astuple(traj)
    # Bytes not yet emitted (headers and small buffers, merged): the struct's array header, then
    # the leading fields (their own fixarray header dropped).
    small = _ARRAY_HEADER + _encode(values[:_HEAD])[1:]
    parts = RecordParts()
    total = 0
    for buf in values[_HEAD:_BULK]:
        size = buf.nbytes if type(buf) is memoryview else memoryview(buf).nbytes
        if size < _SMALL_BUFFER:
            small += _encode(buf)  # bin 8 header + bytes: a short copy beats another part
            continue
        small += _BIN16(0xC5, size) if size < 1 << 16 else _BIN32(0xC6, size)
        parts += (small, buf)
        total += len(small) + size
        small = b""
    small += _encode(values[_BULK:])[1:]  # fixarray header: the tuple has < 16 elements
    parts.append(small)
    parts.nbytes = total + len(small)
    return parts


TRAJECTORY_BULK = (_HEAD, _BULK)  # Trajectory fields [_HEAD, _BULK) are the bulk buffers


def split_trajectory(traj: Trajectory) -> tuple[tuple, bytes, bytes]:
    """``(values, head, tail)``: the fields of ``traj`` as a tuple, the msgpack encoding of the
    fields before the bulk buffers and that of the fields after them (``TRAJECTORY_BULK``).

    For a writer that emits the record's framing itself (``areal.ring._ringcopy.Writer.put_struct``):
    the record is the array header of ``len(values)``, ``head`` without its fixarray header,
    each bulk buffer as msgpack ``bin``, then ``tail`` without its header; exactly
    ``encode_trajectory(traj)`` (a test pins it). Its cost does not grow with the record: the bulk
    buffers are not touched.
    """
    values = _astuple(traj)
    return values, _encode(values[:_HEAD]), _encode(values[_BULK:])


def decode_trajectory(buf: bytes | memoryview) -> Trajectory:
    """Decode a record of any schema up to ``TRAJECTORY_SCHEMA``; fields a record predates take
    their defaults. Buffer fields are views into ``buf``'s memory, which must outlive them."""
    traj = _trajectory_decoder.decode(buf)
    if traj.schema_version > TRAJECTORY_SCHEMA:
        raise ValueError(
            f"Trajectory schema_version {traj.schema_version} is newer than this reader ({TRAJECTORY_SCHEMA}); upgrade the trainer"
        )
    return traj


# --------------------------------------------------------------------------------------------
# Framing for pipes and streams: a 4-byte little-endian length, then one msgpack message.
# --------------------------------------------------------------------------------------------

FRAME_HEADER = struct.Struct("<I")


def frame(payload: bytes) -> bytes:
    return FRAME_HEADER.pack(len(payload)) + payload
