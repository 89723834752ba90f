"""Branch points, the gateway's half: a session forked at a model call, one session per branch.

    episode (sandbox/branch.py)          gateway (routes → intercept, before the front-end)
      call k ──x-areal-branchable: 1──►  the k-th completion call of a session (BranchConfig)?
                                          fork the session N times (keys K_0..K_N-1, each a copy
             ◄──x-areal-branch: order──   of its interactions, prompt index and budgets), retire
                 {"call": k, "keys": [...]} the trunk's key, answer with the order (no sampling)
      fork, one branch at a time:
      branch i: call k again with K_i ──►  session K_i: sampled for branch i alone, and every
                                          later call of branch i; never branches again
      or, refused (threads, children...):
      call k ──x-areal-branch-refused──►  the branch sessions closed, the reason kept on the
                                          trunk, the call served there as if nothing happened

    By replay (``BranchConfig.replay``), where the episode cannot fork:
      call k (not branchable, or refused) ─►  sessions K_1..K_N-1 opened, each empty with a copy
                                          of the trunk's calls (Replay); call k served on the trunk,
                                          which goes on as branch 0 (``split_replayed`` at its end)
      the controller runs the agent anew in K_i: a call before k is answered from the copy with
      its prompt (``replayed``; none: a 409, the divergence kept); call k and on: sampled

    By entropy (``BranchConfig.entropy``), the point is known only once a call is sampled:
      call j ──x-areal-branchable: 1──►  marked a candidate (PROBE); sampled as usual (Gateway.complete)
                                          below the threshold: served, and the next call is a candidate
                                          at or above it: the sample is discarded (not recorded, its
             ◄──x-areal-branch: order──   call and tokens uncharged) and the order sent as above; each
                                          branch samples call j afresh, so the siblings' samples are
                                          alike, none picked for its entropy

Invariants:
- Off unless ``Gateway.branching`` is a ``BranchConfig`` with ``n`` >= 2 (the run's setting); a
  session branches at most once, and a branch's session never does (no nested branch points).
- A branch point is ordered only to a request that says it can fork
  (``x-areal-branchable: 1``, sent by sandbox/relay.py's transports in a sandboxed agent). A call
  reaching the branch point any other way (the loopback relay, the HTTP door, an inline agent),
  or refused by the episode, is served as usual and the refusal is kept with its reason; with
  ``BranchConfig.replay`` it is branched by replay instead (``_replay_point``, below).
- Once the order is sent, the trunk's key is retired: a request on it is a 409 (a branch that
  kept using it, or went through the relay, gets an error, never another branch's session).
- The branches' sessions are kept alive together (a call in one refreshes all): the branches
  run one after another, and one waiting its turn must not expire meanwhile.
- Each branch session holds its own copies of the prefix's interactions (a reward set in one is
  not seen in another), the same prompt index (so branch calls extend the prefix's tokens
  exactly) and the trunk's budgets as they stood (``calls_made``, ``tokens_charged``).

The controller collects a trunk's branch sessions with ``branch_keys`` and the refusal, if any,
with ``refusal`` (areal/controller/branches.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from areal.engine.client import GenerateResult
from areal.gateway.contract import Reply, RequestError
from areal.gateway.render import PromptIndex
from areal.gateway.tree import first_difference
from areal.protocol import BRANCH_ORDER_HEADER, BRANCH_REASON_LIMIT, BRANCH_REFUSED_HEADER, BRANCHABLE_HEADER

if TYPE_CHECKING:
    from areal.gateway.core import Gateway, Session
    from areal.gateway.tree import Interaction

BRANCHABLE, REFUSED, ORDER = BRANCHABLE_HEADER, BRANCH_REFUSED_HEADER, BRANCH_ORDER_HEADER
REASON_LIMIT = BRANCH_REASON_LIMIT
STATE = "areal.branch"  # Session.store key: a trunk's BranchPoint, or a branch's BranchOf
REPLAY = "areal.branch.replay"  # Session.store key: a replaying branch's Replay
PROBE = "areal.branch.probe"  # Session.store key: the Probe of the call whose sample decides (by entropy)
COMPLETION_PATHS = frozenset({"/v1/chat/completions", "/v1/responses", "/v1/messages"})
MAX_BRANCHES = 16


@dataclass
class BranchConfig:
    """Where an episode branches (rollout.branch). Off by default (``n`` = 0)."""

    n: int = 0  # branches per branch point (>= 2); 0: off
    at_call: int = 0  # at the episode's k-th completion call (1-based); 0: not by index
    at_tool_result: bool = False  # at the first completion call whose last message is a tool's result
    # at the first completion call whose sampled tokens' mean entropy, in nats per token, is at least
    # this (estimated by their mean -logprob, as the engine reports it); 0.0: not by entropy
    entropy: float = 0.0
    # a branch point the episode cannot fork at (an exec: agent, a process tree, another HTTP stack,
    # an inline agent): branched by replay instead. The episode goes on as branch 0; each other
    # branch is a new episode of the same row whose calls before the branch point are answered
    # from the trunk's record (``replayed``), so it reaches the point in the same state if the
    # agent is deterministic given its replies, and a call that differs ends it, named
    replay: bool = False

    def __post_init__(self) -> None:
        if self.n and not 2 <= self.n <= MAX_BRANCHES:
            raise ValueError(f"rollout.branch.n must be 0 (off) or 2..{MAX_BRANCHES}, got {self.n}")
        if self.at_call < 0:
            raise ValueError(f"rollout.branch.at_call must be >= 0, got {self.at_call}")
        if not 0.0 <= self.entropy < float("inf"):
            raise ValueError(f"rollout.branch.entropy must be a finite number >= 0 (nats per token; 0: off), got {self.entropy}")
        if self.n and not (self.at_call or self.at_tool_result or self.entropy):
            raise ValueError("rollout.branch.n is set but no branch point is: set rollout.branch.at_call, at_tool_result or entropy")

    @property
    def enabled(self) -> bool:
        return self.n >= 2


@dataclass
class BranchPoint:
    """A trunk session's branch point: the call it is at, its branches' keys in branch order, and
    why it was not taken ("" when it was)."""

    call: int
    keys: list[str] = field(default_factory=list)
    refused: str = ""
    entropy: float | None = None  # the discarded sample's, when the branch point was found by entropy
    # branched by replay (BranchConfig.replay): why the episode could not fork there; ``keys`` are
    # then the replaying branches' (1..n-1) until ``split_replayed`` puts branch 0's first
    replayed: str = ""
    prefix: tuple[str, ...] = ()  # ... and the trunk's interactions at the point, which they replay
    split: bool = False  # branch 0's session made of the trunk (``split_replayed``)


@dataclass(frozen=True)
class Probe:
    """A call whose sample decides whether it is the branch point (by entropy): its number, and
    whether the episode could fork there (the request came through the handed client)."""

    call: int
    branchable: bool


class Resample(Exception):
    """Raised by ``decide`` once a sampled call proved a branch point taken by replay: the sample
    is discarded (not recorded, uncharged) and the call sampled again for the trunk, unselected."""


class BranchOrdered(Exception):
    """Raised by the gateway's core once a sampled call proved the branch point: the route answers
    with ``reply`` (the order) instead of the completion."""

    def __init__(self, reply: Reply) -> None:
        super().__init__("branch order")
        self.reply = reply


@dataclass(frozen=True)
class BranchOf:
    """A branch session's tag: its trunk's episode, the call it branched at, its index, and the
    keys of all the branches of its branch point (one list, shared by the siblings)."""

    episode_id: str
    call: int
    index: int
    siblings: list[str] = field(default_factory=list, compare=False)
    entropy: float | None = None  # the branch point's, when it was found by entropy


def intercept(gateway: Gateway, session: Session, path: str, headers: dict[str, str], body: dict) -> Reply | None:
    """Before the front-end serves a completion call: the branch order, a 409 on a retired trunk
    key, or None (serve it as usual)."""
    config = gateway.branching
    if config is None or not config.enabled or path not in COMPLETION_PATHS:
        return None
    state = session.store.get(STATE)
    if isinstance(state, BranchOf):  # the branches run one after another: those waiting their turn must not expire
        for key in state.siblings:
            if key in gateway.sessions:
                gateway.sessions[key].last_used = session.last_used
        return None
    if isinstance(state, BranchPoint) and state.refused:
        return None
    if isinstance(state, BranchPoint) and state.replayed:  # the trunk goes on as branch 0; its siblings wait for it
        for key in state.keys:
            if key in gateway.sessions:
                gateway.sessions[key].last_used = session.last_used
        return None
    if isinstance(state, BranchPoint):
        reason = headers.get(REFUSED)
        if reason is None:
            raise RequestError(
                409,
                f"session {session.episode_id!r} was branched at call {state.call} into {len(state.keys)} branches: "
                "its key is retired, each branch calls with its own",
                kind="branch_conflict",
            )
        for key in state.keys:
            gateway.close_session(key)
        why = f"refused by the episode: {reason[:REASON_LIMIT]}"
        if config.replay:
            _replay_point(gateway, session, state.call, why, state.entropy)
        else:
            state.refused = why
        return None
    call, branchable = session.calls_made + 1, headers.get(BRANCHABLE) == "1"
    if not (call == config.at_call or (config.at_tool_result and ends_with_tool_result(path, body))):
        if config.entropy:  # decided once sampled: Gateway.complete / complete_stream call ``decide``
            session.store[PROBE] = Probe(call, branchable)
        return None
    if not branchable:
        if config.replay:
            _replay_point(gateway, session, call, NOT_HANDED)
        else:
            session.store[STATE] = BranchPoint(call, refused=NOT_HANDED)
        return None
    return _order(gateway, session, call)


NOT_HANDED = (
    "the call did not come through the client handed to a sandboxed agent (sandbox/relay.py's transports: "
    "httpx clients, async or sync), which alone can fork the episode: an exec: agent, an inline agent, the HTTP door, "
    "or another HTTP stack through the sandbox's loopback relay (rollout.branch.replay=true branches it by replay)"
)


def _order(gateway: Gateway, session: Session, call: int, entropy: float | None = None) -> Reply:
    """Fork ``session`` into the configured number of branches at ``call``; the order's reply."""
    keys: list[str] = []
    keys += [fork_session(gateway, session, BranchOf(session.episode_id, call, i, keys, entropy)) for i in range(gateway.branching.n)]
    session.store[STATE] = BranchPoint(call, list(keys), entropy=entropy)
    return Reply(status=200, body={"branch": {"call": call, "keys": keys}}, headers={ORDER: "order"})


def _replay_point(gateway: Gateway, session: Session, call: int, why: str, entropy: float | None = None) -> None:
    """Branch ``session`` at ``call`` by replay (BranchConfig.replay): it goes on as branch 0, and
    a new session is opened for each other branch, empty, holding a copy of its calls so far to
    be answered from (``Replay``); the controller runs an episode in each (areal/controller/episodes.py)."""
    keys: list[str] = []
    prefix = [msgspec.structs.replace(x) for x in session.interactions.values()]
    for i in range(1, gateway.branching.n):
        key = gateway.open_session(f"{session.episode_id}/b{i}", session.temperature)
        gateway.sessions[key].store[STATE] = BranchOf(session.episode_id, call, i, keys, entropy)
        gateway.sessions[key].store[REPLAY] = Replay(prefix)
        keys.append(key)
    session.store[STATE] = BranchPoint(call, keys, entropy=entropy, replayed=why, prefix=tuple(session.interactions))


@dataclass
class Replay:
    """A replaying branch's record of its trunk's calls before the branch point; each is
    answered once, to a request whose prompt is the recorded one, under the recorded id."""

    calls: list[Interaction]
    used: set[str] = field(default_factory=set)
    diverged: str = ""  # the first request that matched none, named; or the calls never made

    def left(self) -> list[Interaction]:
        return [x for x in self.calls if x.id not in self.used]


def replayed(session: Session, prompt_ids: list[int], n: int) -> list[tuple[GenerateResult, str]] | None:
    """The answers of a replaying branch's call before its branch point, from the record: its n
    choices as (result, interaction id); None when the call is the branch's own (sampled). A call
    whose prompt no unused recorded call has is the divergence: kept on the session, and a 409."""
    replay = session.store.get(REPLAY)
    if not isinstance(replay, Replay) or not replay.left():
        return None
    same = [x for x in replay.left() if x.prompt_ids == prompt_ids][:n]
    if len(same) < n:
        nxt = replay.left()[0]
        pos = first_difference(nxt.prompt_ids, prompt_ids)
        replay.diverged = replay.diverged or (
            f"the replay's call {session.calls_made + 1} differs from the trunk's {nxt.id} at prompt token {pos} "
            f"(prompts of {len(nxt.prompt_ids)} and {len(prompt_ids)} tokens{f', {n} choices' if n > 1 else ''}): "
            "the agent did not repeat its calls given the same replies (random numbers, the clock, tool results that changed)"
        )
        raise RequestError(409, f"branch replay diverged: {replay.diverged}", kind="branch_replay_diverged")
    out = []
    for x in same:
        replay.used.add(x.id)
        versions = [str(v) for v in x.output_versions]
        result = GenerateResult(
            output_ids=list(x.output_ids),
            output_logprobs=list(x.output_logprobs),
            finish_reason=x.finish_reason,
            weight_version=str(x.version),
            prompt_tokens=len(prompt_ids),
            completion_tokens=len(x.output_ids),
            output_versions=versions,
        )
        out.append((result, x.id))
    return out


def replay_divergence(session: Session) -> str:
    """Why a replaying branch did not reach its branch point as its trunk did ("" when it did)."""
    replay = session.store.get(REPLAY)
    if not isinstance(replay, Replay):
        return ""
    if not replay.diverged and replay.left():
        return f"the replay ended with {len(replay.left())} of the trunk's {len(replay.calls)} calls before the branch point not made"
    return replay.diverged


def replay_point(session: Session) -> BranchPoint | None:
    """The branch point of a trunk branched by replay (None for any other session)."""
    state = session.store.get(STATE)
    return state if isinstance(state, BranchPoint) and state.replayed else None


def split_replayed(gateway: Gateway, trunk: Session) -> None:
    """Once a trunk branched by replay has ended: branch 0's session made of it (everything it
    recorded), the trunk left with the prefix its branches share; the branch keys then in branch
    order, as ``expand`` reads them."""
    state = replay_point(trunk)
    assert state is not None and not state.split
    first = gateway.sessions.get(state.keys[0]) or gateway.expired.get(state.keys[0])
    siblings = first.store[STATE].siblings if first is not None else list(state.keys)
    key = fork_session(gateway, trunk, BranchOf(trunk.episode_id, state.call, 0, siblings, state.entropy))
    siblings.insert(0, key)
    state.keys = list(siblings)
    trunk.interactions = {iid: trunk.interactions[iid] for iid in state.prefix if iid in trunk.interactions}
    state.split = True


def probe_of(session: Session) -> Probe | None:
    """The candidate mark ``intercept`` left for this call (taken: a later call is marked anew)."""
    return session.store.pop(PROBE, None)


def sampled_entropy(results: list) -> float:
    """The mean -logprob of the sampled tokens of a call's choices: a one-sample estimate of the
    policy's entropy per token along them (0.0 with no tokens or no logprobs)."""
    lps = [lp for r in results for lp in r.output_logprobs]
    return -sum(lps) / len(lps) if lps else 0.0


def decide(gateway: Gateway, session: Session, probe: Probe, results: list, held: int) -> None:
    """After a candidate call (``probe``) is sampled: below the entropy threshold, nothing (the
    call is served); at or above it, raise ``BranchOrdered`` with the order, the sample discarded
    and the call's charge to the session's budgets taken back (each branch makes the call again,
    charged to its own session), or, when the episode could not fork there, keep the refusal and
    serve the call. ``held``: the tokens the call holds of the session's budget."""
    config, entropy = gateway.branching, sampled_entropy(results)
    if config is None or not config.entropy or entropy < config.entropy or session.store.get(STATE) is not None:
        return  # a concurrent call of the session may have settled its branch point meanwhile
    if not probe.branchable and not config.replay:
        session.store[STATE] = BranchPoint(probe.call, refused=NOT_HANDED, entropy=entropy)
        return
    session.calls_made -= 1
    session.tokens_charged -= held
    if not probe.branchable:  # branched by replay: the trunk samples the call afresh too, as every replaying branch does
        _replay_point(gateway, session, probe.call, NOT_HANDED, entropy)
        raise Resample
    raise BranchOrdered(_order(gateway, session, probe.call, entropy))


def ends_with_tool_result(path: str, body: dict) -> bool:
    """Whether the call's last message is a tool's result (the first call after a tool ran), in
    the API of ``path``."""
    if path == "/v1/chat/completions":
        messages = body.get("messages")
        return isinstance(messages, list) and bool(messages) and isinstance(messages[-1], dict) and messages[-1].get("role") == "tool"
    if path == "/v1/messages":
        messages = body.get("messages")
        last = messages[-1] if isinstance(messages, list) and messages else None
        content = last.get("content") if isinstance(last, dict) else None
        return isinstance(content, list) and any(isinstance(b, dict) and b.get("type") == "tool_result" for b in content)
    items = body.get("input")  # /v1/responses
    last = items[-1] if isinstance(items, list) and items else None
    return isinstance(last, dict) and last.get("type") == "function_call_output"


def fork_session(gateway: Gateway, trunk: Session, tag: BranchOf) -> str:
    """A new session in ``trunk``'s state, tagged ``tag``; its key."""
    key = gateway.open_session(f"{trunk.episode_id}/b{tag.index}", trunk.temperature)
    branch = gateway.sessions[key]
    branch.interactions = {iid: msgspec.structs.replace(x) for iid, x in trunk.interactions.items()}
    index = trunk.index
    # The shared render cache's entries (``cached``, ``heads``, ``history``) stay the trunk's: a cache, rebuilt on use.
    branch.index = PromptIndex(by_key=dict(index.by_key), drift=index.drift, incremental=index.incremental, full=index.full)
    branch.store = copy.deepcopy({k: v for k, v in trunk.store.items() if k != STATE})
    branch.store[STATE] = tag
    branch.calls_made, branch.tokens_charged = trunk.calls_made, trunk.tokens_charged
    return key


def branch_keys(session: Session) -> list[str]:
    """The keys of a trunk session's branches, in branch order ([] when it did not branch)."""
    state = session.store.get(STATE)
    return list(state.keys) if isinstance(state, BranchPoint) and not state.refused else []


def never_branch(session: Session, why: str) -> None:
    """Keep ``session`` from ever branching; ``refusal`` then says ``why``."""
    session.store[STATE] = BranchPoint(0, refused=why)


def refusal(session: Session) -> str:
    """Why a trunk session's branch point was not taken ("" when it was, or had none)."""
    state = session.store.get(STATE)
    return state.refused if isinstance(state, BranchPoint) else ""


def branch_of(session: Session) -> BranchOf | None:
    state = session.store.get(STATE)
    return state if isinstance(state, BranchOf) else None
