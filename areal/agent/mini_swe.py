"""mini-swe-agent as the agent (``rollout.agent=mini-swe``), its own loop run unchanged in its own
private venv; both ends of that process boundary live here.

    rollout.agent=mini-swe                      mini-swe-agent's ``mini.yaml`` (what its ``mini`` command runs)
    rollout.agent=mini-swe:CONFIG               another of its configs (a built-in name, or a .yaml path)
    '+rollout.agent_kwargs={agent: {step_limit: 10}, model: {model_class: litellm_textbased}}'
                                                merged over the config, as its ``-c key=value`` would be

    episode process (sandbox or inline; cwd /workspace)   private venv's interpreter (python -P this file --inside episode)
    ───────────────────────────────────────────────────   ─────────────────────────────────────────────────────────────
    mini_swe_agent(spec).run(row) ── stdin: {config, task} ──► its config merged; model: litellm, ``openai/policy`` at
                                                              the episode's OPENAI_BASE_URL and key; environment: its
                                                              LocalEnvironment in the episode's cwd
                                                              DefaultAgent(model, env, **config["agent"]).run(task):
                                                                query ─► litellm ─► relay ─► gateway (recorded)
                                                                each bash action ─► subprocess in /workspace
    None (the grader's verdict) ◄── stdout: one JSON line {exit_status, calls, commands} | {error}

Why a second interpreter: mini-swe-agent 2.4.6 needs litellm, which needs botocore and so
``python-dateutil<3``, where this project pins ``python-dateutil==4.0.0``; it also resolves to
openai 3.x and pydantic 2.14, past the agent SDKs' pins. So it lives in its own venv (``make
mini-swe-venv``: ``mini_swe_venv_dir()``) and this file runs there too: its top level imports only
the standard library.

The task is the row's ``question`` (a ``swe:`` task's row: the task's prompt after a preamble,
areal/tasks/swe.py), rendered into mini-swe-agent's own templates. The reward is not the agent's:
``run`` returns None, so a row with a world gets the grader's verdict (sandbox/grader.py) and a row
without one needs the run's ``reward`` function. How mini-swe-agent's episode ended (``Submitted``,
``LimitsExceeded``, ``RepeatedFormatError``...) is logged; an exception it raised (a failed call,
a bad config) is an error naming it.

Offline and bounded: litellm reads the model cost map it ships (``LITELLM_LOCAL_MODEL_COST_MAP``)
and cost tracking ignores the unknown model; a failed call is not retried with back-off for
minutes (``MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT``, default 1 here); its global config directory is
a temporary one (the episode's home may not be writable). A config whose step limit is 0 (no
limit, as ``mini.yaml``'s) gets ``STEP_LIMIT``: an episode must end before its deadline to train.

What is covered: mini-swe-agent's DefaultAgent with its litellm models (tool calls, or
``litellm_textbased`` for a model without a tool template) and its LocalEnvironment, in a sandboxed
episode's workspace. What is not: its other environments (docker, singularity, swe-rex: the
sandbox is the container), its interactive agent, its batch runners and trajectory viewer; an
inline episode cut at its deadline leaves a command still running to its own end.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

PREFIX = "mini-swe"
PINS = ("mini-swe-agent==2.4.6", "litellm==1.110.2", "openai==3.57.0")  # openai: what litellm resolved to when tested
DEFAULT_CONFIG = "mini"  # the config of mini-swe-agent's `mini` command
MODEL = "openai/policy"  # litellm's OpenAI-compatible provider; the gateway serves its one policy whatever the name
STEP_LIMIT = 30
OFFLINE_ENV = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # never fetch the cost map
    "MSWEA_COST_TRACKING": "ignore_errors",  # the policy has no price
    "MSWEA_SILENT_STARTUP": "1",
}


class MiniSweError(RuntimeError):
    """mini-swe-agent failed: its venv is missing, its config does not load, or its agent raised."""


def is_mini_swe_spec(spec: str) -> bool:
    return spec == PREFIX or spec.startswith(PREFIX + ":")


def mini_swe_venv_dir() -> Path:
    """The private venv (``make mini-swe-venv``): ``$AREAL_MINI_SWE_VENV``, else
    ``$AREAL_CACHE/mini-swe-venv`` (``~/.cache/areal/mini-swe-venv``)."""
    from areal.agent import private_venv

    return private_venv.venv_dir("AREAL_MINI_SWE_VENV", "mini-swe-venv")


def mini_swe_python(spec: str = PREFIX) -> Path:
    """The private venv's interpreter; a ``MiniSweError`` saying how to build it when absent."""
    from areal.agent import private_venv

    what = f"rollout.agent={spec}: mini-swe-agent"
    return private_venv.interpreter(mini_swe_venv_dir(), what, "mini-swe-venv", "AREAL_MINI_SWE_VENV", " ".join(PINS), MiniSweError)


def read_paths(spec: str) -> list[str]:
    """What a sandboxed episode of ``spec`` must read besides Python's own paths: the private venv."""
    root = mini_swe_venv_dir()
    return [str(root)] if is_mini_swe_spec(spec) and root.is_dir() else []


def mini_swe_agent(spec: str, kwargs: dict[str, Any] | None = None) -> Callable[..., Awaitable[None]]:
    """The agent run of ``spec`` (module docstring); ``kwargs`` (``rollout.agent_kwargs``) is merged
    over the config. Checks now, where the host is visible (the zygote, before any fork), that the
    venv exists and the config loads: a ``MiniSweError`` naming what is wrong."""
    from areal.agent import private_venv

    config = spec.partition(":")[2] or DEFAULT_CONFIG
    python = str(mini_swe_python(spec))  # resolved here: a sandboxed episode has another HOME
    what = f"rollout.agent={spec}"
    reply = private_venv.call(python, __file__, "check", _request(spec, config, kwargs), what)
    if "error" in reply:
        raise MiniSweError(reply["error"])

    async def run(data: dict, **_: Any) -> None:
        # cancelled (the episode's deadline, inline): mini-swe-agent stops first. Its commands run in sessions
        # of their own: a sandboxed episode's cgroup ends them; inline, one still running is not waited for
        request = _request(spec, config, kwargs, task=data.get("question") or data["messages"][-1]["content"])
        reply = await private_venv.call_async(python, __file__, "episode", request, what)
        if "error" in reply:
            raise MiniSweError(reply["error"])
        print(f"mini-swe-agent: {reply['exit_status']} after {reply['calls']} calls, {len(reply['commands'])} commands", file=sys.stderr)
        return None  # the reward is the grader's (a world) or the run's reward function's

    return run


def _request(spec: str, config: str, kwargs: dict[str, Any] | None, **fields: Any) -> bytes:
    return json.dumps({"spec": spec, "config": config, "overrides": kwargs or {}, **fields}).encode()


# ---- the private side: runs in the mini-swe-agent venv, imports it ----------------------------


def _inside(command: str) -> int:
    request = json.loads(sys.stdin.read())
    reply_fd = os.dup(1)  # the reply channel; fd 1 becomes stderr, for mini-swe-agent and its commands' logs
    os.dup2(2, 1)
    for name, value in {**OFFLINE_ENV, "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": "1"}.items():
        os.environ.setdefault(name, value)
    os.environ.setdefault("MSWEA_GLOBAL_CONFIG_DIR", tempfile.mkdtemp(prefix="mini-swe-config-"))
    try:
        config = _config(request)
        reply: dict[str, Any] = {"ok": True} if command == "check" else _run_episode(config, request["task"])
    except Exception as e:  # the process boundary: the reply names what failed
        reply = {"error": f"rollout.agent={request['spec']}: mini-swe-agent failed: {type(e).__name__}: {e}"[:8000]}
    with os.fdopen(reply_fd, "w") as out:
        out.write(json.dumps(reply) + "\n")
    return 0


def _config(request: dict[str, Any]) -> dict[str, Any]:
    """mini-swe-agent's config ``request["config"]`` with the overrides, the model pointed at the
    episode's endpoint and the environment local, in this process's working directory."""
    from minisweagent.config import get_config_from_spec
    from minisweagent.utils.serialize import recursive_merge

    config = recursive_merge(get_config_from_spec(request["config"]), request["overrides"])
    endpoint = {"api_base": os.environ.get("OPENAI_BASE_URL", ""), "api_key": os.environ.get("OPENAI_API_KEY", "")}
    config["model"] = recursive_merge(config.get("model", {}), {"model_name": MODEL, "model_kwargs": endpoint})
    config["environment"] = recursive_merge(config.get("environment", {}), {"environment_class": "local", "cwd": os.getcwd()})
    agent = config.setdefault("agent", {})
    if not agent.get("step_limit"):
        agent["step_limit"] = STEP_LIMIT
    return config


def _run_episode(config: dict[str, Any], task: str) -> dict[str, Any]:
    import litellm
    from minisweagent.agents import get_agent
    from minisweagent.environments import get_environment
    from minisweagent.models import get_model

    litellm.suppress_debug_info = True  # its "Provider List" banner for each call of a model it cannot price
    model = get_model(config=config["model"])
    env = get_environment(config["environment"])
    agent = get_agent(model, env, config["agent"], default_type="default")
    info = agent.run(task)
    commands = [a["command"] for m in agent.messages for a in (m.get("extra") or {}).get("actions", [])]
    return {"exit_status": info.get("exit_status", ""), "calls": agent.n_calls, "commands": commands}


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(_inside(sys.argv[2]))
