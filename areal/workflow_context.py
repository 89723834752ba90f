"""AReaL's ``from areal import workflow_context``: re-exports ``areal/agent/context.py``."""

from areal.agent.context import WorkflowContext, calling, gateway_config, get, register_client, set, stat_scope

__all__ = ["WorkflowContext", "calling", "gateway_config", "get", "register_client", "set", "stat_scope"]
