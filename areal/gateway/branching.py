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
  (``x-areal-branchable: 1``, sent by ``sandbox.relay.ZmqTransport``, the client handed to a
  sandboxed agent). A call reaching the branch point any other way (the loopback relay, the HTTP
  door, an inline agent) is served as usual and the refusal is kept with its reason.
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

from areal.gateway.contract import Reply, RequestError
from areal.gateway.render import PromptIndex
from areal.protocol import BRANCH_ORDER_HEADER, BRANCH_REASON_LIMIT, BRANCH_REFUSED_HEADER, BRANCHABLE_HEADER

if TYPE_CHECKING:
    from areal.gateway.core import Gateway, Session

BRANCHABLE, REFUSED, ORDER = BRANCHABLE_HEADER, BRANCH_REFUSED_HEADER, BRANCH_ORDER_HEADER
REASON_LIMIT = BRANCH_REASON_LIMIT
STATE = "areal.branch"  # Session.store key: a trunk's BranchPoint, or a branch's BranchOf
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


@dataclass(frozen=True)
class Probe:
    """A call whose sample decides whether it is the branch point (by entropy): its number, and
    whether the episode could fork there (the request came through the handed client)."""

    call: int
    branchable: bool


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
    if isinstance(state, BranchPoint):
        reason = headers.get(REFUSED)
        if reason is None:
            raise RequestError(
                409,
                f"session {session.episode_id!r} was branched at call {state.call} into {len(state.keys)} branches: "
                "its key is retired, each branch calls with its own",
                kind="branch_conflict",
            )
        state.refused = f"refused by the episode: {reason[:REASON_LIMIT]}"
        for key in state.keys:
            gateway.close_session(key)
        return None
    call, branchable = session.calls_made + 1, headers.get(BRANCHABLE) == "1"
    if not (call == config.at_call or (config.at_tool_result and ends_with_tool_result(path, body))):
        if config.entropy:  # decided once sampled: Gateway.complete / complete_stream call ``decide``
            session.store[PROBE] = Probe(call, branchable)
        return None
    if not branchable:
        session.store[STATE] = BranchPoint(call, refused=NOT_HANDED)
        return None
    return _order(gateway, session, call)


NOT_HANDED = (
    "the call did not come through the client handed to a sandboxed agent (sandbox.relay.ZmqTransport), "
    "which alone can fork the episode: an inline agent, the HTTP door, or the sandbox's loopback relay"
)


def _order(gateway: Gateway, session: Session, call: int, entropy: float | None = None) -> Reply:
    """Fork ``session`` into the configured number of branches at ``call``; the order's reply."""
    keys: list[str] = []
    keys += [fork_session(gateway, session, BranchOf(session.episode_id, call, i, keys, entropy)) for i in range(gateway.branching.n)]
    session.store[STATE] = BranchPoint(call, list(keys), entropy=entropy)
    return Reply(status=200, body={"branch": {"call": call, "keys": keys}}, headers={ORDER: "order"})


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
    if not probe.branchable:
        session.store[STATE] = BranchPoint(probe.call, refused=NOT_HANDED, entropy=entropy)
        return
    session.calls_made -= 1
    session.tokens_charged -= held
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
