"""AReaL's engine-level API: a workflow calls ``await engine.agenerate(ModelRequest(...))`` itself.

    controller ─► RecordedWorkflow.arun_episode(engine client, data)
                    ├─ GatewayEngine(engine client)  (one per call: its Sessions are the call's clients)
                    ├─ workflow.arun_episode(GatewayEngine, data)
                    │     ├─ agenerate(req) ─► engine.generate(input_ids) ─► Interaction in a Session
                    │     │                  ◄─ ModelResponse (the recorded tokens, logprobs, versions)
                    │     └─ its own OpenAI client on engine.addresses[0] ─► the run gateway's HTTP door
                    │          (WorkflowDoor: one session for the whole run) ─► Interactions there
                    └─ rows(result): the workflow's rows ─► the recorded rows they are (rewards set;
                                     the door's calls they name move to this call's own Session)

One record, the gateway's: every ``agenerate`` becomes an ``Interaction`` (``areal.gateway.tree``)
in a gateway ``Session``, holding the prompt ids sent, the ids, logprobs and per-token versions
the engine returned, and the parent whose prompt + output the prompt extends, as a chat call
through the gateway would (``areal.gateway.generation.record_choice``). A call extending no
earlier one opens a new Session, registered with the workflow context like an ``ArealOpenAI``
client, so the controller tells a workflow sampling its whole group apart from one sampling one
trajectory per call (``areal.agent.groups``). What the run trains is the recorded rows: AReaL's
tensor dict (``input_ids``, ``loss_mask``, ``rewards`` ...) names which, by its tokens; a row
whose tokens the engine did not serve, or that trains a token it did not sample, is an error.

Limits of one call, AReaL's: ``min(gconfig.max_new_tokens, gconfig.max_tokens - prompt)`` new
tokens, within the run's context (the gateway's, capped at the model's positions); none left is
a ``RuntimeError`` as in AReaL. Not covered: the gateway's per-session budgets
(``gateway.max_calls_per_session`` ...) and its stop-string cut (the engine's own stop applies).
"""

from __future__ import annotations

import abc
import time
import weakref
from collections import Counter
from collections.abc import Mapping
from typing import Any

from areal.agent import context as workflow_context
from areal.api.cli_args import InferenceEngineConfig
from areal.api.io_struct import ModelRequest, ModelResponse
from areal.gateway.contract import new_id
from areal.gateway.core import Session
from areal.gateway.generation import parse_version
from areal.gateway.tree import Interaction, InteractionWithTokenLogpReward, export_interactions, extended_by, set_reward

__all__ = ["GatewayEngine", "InferenceEngine", "ModelRequest", "ModelResponse", "RecordedWorkflow"]


class InferenceEngine(abc.ABC):
    """AReaL's rollout engine as a workflow sees it: ``agenerate``, ``get_version``, ``config``."""

    config: InferenceEngineConfig

    @abc.abstractmethod
    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        """One generation of ``req.input_ids`` (``req.gconfig.n_samples`` must be 1)."""

    @abc.abstractmethod
    def get_version(self) -> int:
        """The policy version of the latest generation."""


class GatewayEngine(InferenceEngine):
    """``agenerate`` over an engine client, recorded into gateway Sessions (one per trajectory).

    The engine client's own methods (``generate``, ``generate_stream`` ...) pass through, so an
    ``ArealOpenAI(engine=this)`` made in the same workflow records its chat calls as usual."""

    def __init__(self, engine: Any, config: InferenceEngineConfig | None = None, episode_id: str = "areal-engine") -> None:
        self.engine = engine
        self.config = config or InferenceEngineConfig()
        self.episode_id = episode_id
        self.sessions: list[Session] = []
        self._version = 0
        self._door = WorkflowDoor.of_run()  # the run's HTTP door (engine.addresses), None outside a run

    def __getattr__(self, name: str) -> Any:  # only for what this class does not define
        if "engine" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self.__dict__["engine"], name)

    @property
    def addresses(self) -> list[str]:
        """AReaL's server addresses (``host:port``): here the run's gateway HTTP door, with the
        run's workflow session in the path. A workflow that builds its own OpenAI client on it
        (AReaL's scaffolding worker: ``AsyncOpenAI(base_url=f"http://{addresses[0]}/v1")``) is
        served by the gateway (Completions, Chat Completions, Responses, Messages) and recorded;
        its rows are then matched to those calls as to ``agenerate``'s (``WorkflowDoor``)."""
        if self._door is None:
            raise RuntimeError("engine.addresses names the run's gateway, which only a run's workflow call has")
        return [self._door.address]

    @property
    def interactions(self) -> dict[str, Interaction]:
        """Every recorded interaction, in call order."""
        return {i.id: i for i in sorted((i for s in self.sessions for i in s.interactions.values()), key=lambda i: i.created)}

    def get_version(self) -> int:
        return self._version

    async def agenerate(self, req: ModelRequest) -> ModelResponse:
        g, ids = req.gconfig, [int(t) for t in req.input_ids]
        if g.n_samples != 1:
            raise ValueError(f"agenerate samples one sequence: gconfig.n_samples must be 1, got {g.n_samples} (call it n times)")
        run = workflow_context.gateway_config()
        limits = [g.max_new_tokens, g.max_tokens - len(ids)] + ([run.context_length - len(ids)] if run else [])
        max_new = min(limits)
        if max_new <= 0:
            raise RuntimeError(
                f"max_new_tokens ({max_new}) is non-positive: max_tokens={g.max_tokens}, prompt_len={len(ids)}, "
                f"max_new_tokens={g.max_new_tokens}" + (f", run context {run.context_length}" if run else "")
            )
        parent = extended_by(self._all(), ids)
        session = self._owner(parent.id) if parent else self._open_session()
        params: dict[str, Any] = {"max_new_tokens": max_new, "temperature": 0.0 if g.greedy else g.temperature, "top_p": g.top_p}
        if g.stop_token_ids:
            params["stop_token_ids"] = list(g.stop_token_ids)
        if g.stop:
            params["stop"] = list(g.stop)
        if 0 < g.top_k < 10**8:  # AReaL's "no limit" is 1e8, this system's -1
            params["top_k"] = g.top_k
        if g.min_new_tokens:
            params["min_new_tokens"] = g.min_new_tokens
        t0 = time.monotonic()
        result = await self.engine.generate(ids, params, return_logprob=True, session_key=session.episode_id)
        version = parse_version(result.weight_version)
        versions = [parse_version(v) for v in result.output_versions] or [version] * len(result.output_ids)
        inter = Interaction(
            id=new_id("gen-"),
            prompt_ids=ids,
            output_ids=list(result.output_ids),
            output_logprobs=list(result.output_logprobs),
            version=version,
            finish_reason=result.finish_reason,
            created=time.time(),
            parent_id=parent.id if parent else None,
            output_versions=versions,
        )
        session.interactions[inter.id] = inter
        self._version = max(self._version, version)
        return ModelResponse(
            input_tokens=list(ids),
            output_tokens=list(inter.output_ids),
            output_logprobs=list(inter.output_logprobs),
            output_versions=list(versions),
            stop_reason=inter.finish_reason,
            tokenizer=req.tokenizer,
            latency=time.monotonic() - t0,
            interaction_id=inter.id,
        )

    def _open_session(self) -> Session:
        session = Session(key=new_id("sk-engine-"), episode_id=f"{self.episode_id}-{len(self.sessions)}")
        self.sessions.append(session)
        workflow_context.register_client(session)
        return session

    def _all(self) -> list[Interaction]:
        """This call's recorded interactions, then the run's HTTP door's not yet claimed."""
        own = [i for s in self.sessions for i in s.interactions.values()]
        return own + (list(self._door.session.interactions.values()) if self._door is not None else [])

    def _owner(self, interaction_id: str) -> Session:
        session = self._session_holding(interaction_id)
        if session is None:
            raise KeyError(interaction_id)
        return session

    def _session_holding(self, interaction_id: str) -> Session | None:
        for session in self.sessions:
            if interaction_id in session.interactions:
                return session
        door = self._door
        return door.session if door is not None and interaction_id in door.session.interactions else None

    # ---- what a workflow returned ─► the recorded rows -----------------------------------------

    def rows(self, result: Any) -> dict[str, InteractionWithTokenLogpReward] | None:
        """The rows to train for ``result``: recorded rows as they are; AReaL's tensor dict
        (batch of padded rows), or interactions the workflow built (each with ``to_tensor_dict``,
        ``areal.experimental.openai.types``), as the recorded rows with those tokens, rewards set."""
        if result is None or (isinstance(result, Mapping) and not result):
            return None
        if isinstance(result, Mapping) and all(isinstance(v, InteractionWithTokenLogpReward) for v in result.values()):
            return dict(result)
        if isinstance(result, Mapping) and all(callable(getattr(v, "to_tensor_dict", None)) for v in result.values()):
            # interactions the workflow built itself (areal.experimental.openai.types): each one's row
            out: dict[str, InteractionWithTokenLogpReward] = {}
            for value in result.values():
                out.update(self._recorded(value.to_tensor_dict(), taken=out))
            return self._claimed(out)
        if not (isinstance(result, Mapping) and "input_ids" in result):
            raise TypeError(
                "arun_episode must return {id: InteractionWithTokenLogpReward}, AReaL's tensor dict "
                f"(input_ids, loss_mask, rewards ...) or None, got {type(result).__name__}"
            )
        return self._claimed(self._recorded(result, taken={}))

    def _claimed(self, rows: dict[str, InteractionWithTokenLogpReward]) -> dict[str, InteractionWithTokenLogpReward]:
        """Rows of calls made over the run's HTTP door move, with their ancestors, from the door's
        session to one of this call's own, so that no other call trains them too."""
        if self._door is None:
            return rows
        mine = self._door.take([row.interaction for row in rows.values()])
        if mine:
            session = self._open_session()
            session.interactions.update((i.id, i) for i in sorted(mine, key=lambda i: i.created))
        return rows

    def _recorded(self, result: Mapping[str, Any], taken: Mapping[str, Any]) -> dict[str, InteractionWithTokenLogpReward]:
        """The recorded rows whose tokens AReaL's tensor dict ``result`` holds, none of ``taken``."""
        ids, mask = _rows_of(result["input_ids"]), _rows_of(result["loss_mask"])
        attention = _rows_of(result["attention_mask"]) if "attention_mask" in result else [[1] * len(r) for r in ids]
        rewards = _flat(result["rewards"])
        if not len(ids) == len(mask) == len(attention) == len(rewards):
            raise ValueError(f"the rows disagree in number: input_ids {len(ids)}, loss_mask {len(mask)}, rewards {len(rewards)}")
        candidates = self._chains()
        out: dict[str, InteractionWithTokenLogpReward] = {}
        for b, (row_ids, row_mask, row_att, reward) in enumerate(zip(ids, mask, attention, rewards)):
            keep = [i for i, a in enumerate(row_att) if a]
            tokens, trained = tuple(row_ids[i] for i in keep), [int(row_mask[i]) for i in keep]
            match = next((c for c in candidates.get(tokens, []) if c.interaction.id not in out and c.interaction.id not in taken), None)
            if match is None:
                raise ValueError(
                    f"row {b}: its {len(tokens)} tokens are not a sequence the engine served in this episode's calls "
                    "(its agenerate calls, or calls over engine.addresses that no other episode claimed)"
                )
            extra = [i for i, (m, r) in enumerate(zip(trained, match.loss_mask)) if m and not r]
            if extra:
                raise ValueError(f"row {b}: loss_mask trains token {extra[0]}, which the engine did not sample")
            inter = match.interaction
            set_reward(self._owner(inter.id).interactions, inter.id, reward)
            out[inter.id] = InteractionWithTokenLogpReward(
                interaction=inter,
                input_ids=list(match.input_ids),
                loss_mask=trained,
                logprobs=[lp if m else 0.0 for lp, m in zip(match.logprobs, trained)],
                versions=[v if m else -1 for v, m in zip(match.versions, trained)],
                reward=float(reward),
            )
        return out

    def _chains(self) -> dict[tuple[int, ...], list[InteractionWithTokenLogpReward]]:
        """Every recorded interaction's root-to-it row (concat export), by its tokens."""
        found: dict[tuple[int, ...], list[InteractionWithTokenLogpReward]] = {}
        for inter in self._all():
            chain = {inter.id: inter}
            node = inter
            while node.parent_id is not None and (owner := self._session_holding(node.parent_id)) is not None:
                node = owner.interactions[node.parent_id]  # a parent claimed elsewhere meanwhile ends the walk
                chain[node.id] = node
            row = export_interactions(dict(reversed(chain.items())), "concat")[inter.id]
            found.setdefault(tuple(row.input_ids), []).append(row)
        return found


class WorkflowDoor:
    """The run gateway's HTTP door as AReaL's ``engine.addresses``: one session of the run's
    gateway, ``host:port/sessions/<key>``, for every call workflows make over HTTP.

    One session for the whole run, not one per ``arun_episode``: AReaL's workflows build their
    client on the first call and keep it (the scaffolding workflow does), so an address must serve
    every later call too. The calls are told apart afterwards, by their tokens: each call's rows
    are matched to the door's recorded calls (``GatewayEngine.rows``), and those claimed leave the
    door (``take``) for the claiming call's own session, so no row is trained twice; calls claimed
    by nobody (a failed episode's) are dropped after ``UNCLAIMED_S``. A claimed call is also taken
    off the session's budget counters (``gateway.max_calls_per_session`` ...), which bound a
    session, not a run. Two calls with the same tokens are interchangeable: the same row."""

    UNCLAIMED_S = 3600.0
    _of_gateway: weakref.WeakKeyDictionary[Any, WorkflowDoor] = weakref.WeakKeyDictionary()

    def __init__(self, gateway: Any, url: str) -> None:
        self.gateway = gateway
        self.key = gateway.open_session("workflow-http")
        self.session: Session = gateway.sessions[self.key]
        self.address = f"{url.split('://', 1)[-1]}/sessions/{self.key}"

    @classmethod
    def of_run(cls) -> WorkflowDoor | None:
        """The door of the run whose workflow call this is (made at its first use), else None."""
        run = workflow_context.gateway_door()
        if run is None:
            return None
        gateway, url = run
        door = cls._of_gateway.get(gateway)
        if door is None:
            door = cls._of_gateway[gateway] = cls(gateway, url)
        elif door.key not in gateway.sessions:  # expired or closed: the same key again, for the clients that keep it
            if door.key in gateway.expired:
                gateway.close_session(door.key)
            calls = door.session.interactions
            gateway.open_session("workflow-http", key=door.key)
            door.session = gateway.sessions[door.key]
            door.session.interactions.update(calls)
        return door

    def take(self, interactions: list[Interaction]) -> list[Interaction]:
        """Remove ``interactions`` that are the door's, and their ancestors that no call left at
        the door extends (a call with the same tokens in another episode may); return them."""
        calls = self.session.interactions
        taken = {i.id: calls.pop(i.id) for i in interactions if i.id in calls}
        extending = Counter(i.parent_id for i in calls.values())
        above = [i.parent_id for i in taken.values()]
        while above:
            pid = above.pop()
            if pid is None or pid not in calls or extending[pid]:
                continue
            node = taken[pid] = calls.pop(pid)
            extending[node.parent_id] -= 1
            above.append(node.parent_id)
        stale = time.time() - self.UNCLAIMED_S
        dropped = [calls.pop(i.id) for i in list(calls.values()) if i.created < stale]
        for inter in [*taken.values(), *dropped]:
            self.session.calls_made -= 1
            self.session.tokens_charged -= len(inter.output_ids)
        self.session.last_used = time.monotonic()  # in use while the run claims calls: never idle-expired
        return list(taken.values())


class RecordedWorkflow:
    """A ``RolloutWorkflow`` run by this system: its ``arun_episode`` gets a ``GatewayEngine``
    over the run's engine client, and what it returns becomes the recorded rows (``rows``)."""

    def __init__(self, workflow: Any, config: InferenceEngineConfig | None = None) -> None:
        self.workflow, self.config = workflow, config

    async def arun_episode(self, engine: Any, data: dict[str, Any]) -> dict[str, InteractionWithTokenLogpReward] | None:
        facade = engine if isinstance(engine, GatewayEngine) else GatewayEngine(engine, self.config)
        return facade.rows(await self.workflow.arun_episode(facade, data))


def _rows_of(value: Any) -> list[list[Any]]:
    """A (B, T) tensor or nested list as lists; a (T,) one as one row."""
    rows = value.tolist() if hasattr(value, "tolist") else list(value)
    return rows if rows and isinstance(rows[0], list) else [rows]


def _flat(value: Any) -> list[float]:
    """Rewards, (B,), (B, 1) or a scalar, as floats."""
    values = value.tolist() if hasattr(value, "tolist") else value
    if not isinstance(values, list):
        return [float(values)]
    return [float(v[0] if isinstance(v, list) else v) for v in values]
