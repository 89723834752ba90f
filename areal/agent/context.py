"""What a running workflow may ask about its own call: AReaL's ``from areal import workflow_context``.

    controller ─ with calling(is_eval=, task_id=) as clients: ─► workflow.arun_episode(engine, data)
                                                                    └─ ArealOpenAI(...) ─► register_client(session)
               ◄─ clients: the sessions (one per ArealOpenAI) the call opened, in creation order

``get()`` / ``set()`` / ``stat_scope()`` are AReaL's names. The client list is how the controller
tells a workflow that samples a whole group per call (AReaL before ``group_size``: n clients per
``arun_episode``) from one that samples one trajectory per call (AReaL now, which makes
``gconfig.n_samples`` calls per prompt): each exported row is traced back to the client that
recorded it. Context variables are copied into tasks, so clients made under ``asyncio.gather``
inside the call are seen too. The run's gateway settings travel the same way
(``gateway_config``), so an ``ArealOpenAI`` made in a call keeps the run's limits: its context
capped at what the engine's model holds, AReaL's ``gconfig.max_tokens``.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any


@dataclasses.dataclass(frozen=True)
class WorkflowContext:
    """The call's context: an evaluation call or a training one, and the controller's task id."""

    is_eval: bool = False
    task_id: int | None = None


_context: ContextVar[WorkflowContext] = ContextVar("workflow_context", default=WorkflowContext())
_clients: ContextVar[list[Any] | None] = ContextVar("workflow_clients", default=None)
_gateway: ContextVar[Any | None] = ContextVar("workflow_gateway", default=None)
_door: ContextVar[tuple[Any, str] | None] = ContextVar("workflow_door", default=None)


def set(ctx: WorkflowContext) -> None:  # noqa: A001 - AReaL's name
    """Set the current workflow context."""
    _context.set(ctx)


def get() -> WorkflowContext:
    """The current workflow context (the default outside a workflow call)."""
    return _context.get()


def stat_scope() -> str:
    """``"eval-rollout"`` in an evaluation call, ``"rollout"`` otherwise (AReaL's stats scopes)."""
    return "eval-rollout" if get().is_eval else "rollout"


def register_client(session: Any) -> None:
    """Called by ``ArealOpenAI``: note the session it records into, if a workflow call is running."""
    clients = _clients.get()
    if clients is not None:
        clients.append(session)


def gateway_config() -> Any | None:
    """The run's ``GatewayConfig`` during a workflow call of a run, else None."""
    return _gateway.get()


def gateway_door() -> tuple[Any, str] | None:
    """The run's ``Gateway`` and the base URL of its HTTP door during a workflow call of a run,
    else None (what AReaL's ``engine.addresses`` names: ``areal.api.engine_api``)."""
    return _door.get()


@contextlib.contextmanager
def calling(
    is_eval: bool = False, task_id: int | None = None, gateway: Any | None = None, door: tuple[Any, str] | None = None
) -> Iterator[list[Any]]:
    """Run a workflow call in this context (``gateway``: the run's ``GatewayConfig``; ``door``: its
    ``Gateway`` and HTTP door's URL); yields the list the call's clients are added to."""
    clients: list[Any] = []
    token_ctx = _context.set(WorkflowContext(is_eval=is_eval, task_id=task_id))
    token_clients = _clients.set(clients)
    token_gateway = _gateway.set(gateway)
    token_door = _door.set(door)
    try:
        yield clients
    finally:
        _door.reset(token_door)
        _gateway.reset(token_gateway)
        _clients.reset(token_clients)
        _context.reset(token_ctx)
