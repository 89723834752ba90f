"""A Node agent on the official `openai` npm client, sandboxed with the default config.

Runtimes reserve far more address space than they use (V8's WebAssembly reservations alone are
tens of GiB), so an RLIMIT_AS cap fails them in every episode (`WebAssembly.instantiate(): Out of
memory`). The default sandbox leaves address space unlimited and bounds real pages with the
cgroup. The agent (tests/support/node_agent/agent.mjs, an ``exec:`` agent; ``make test`` installs its
npm dependency) streams a chat completion with a tool, runs the tool, streams the answer, all
through the relay and a real gateway to the real engine serving the scripted model (a
``calculator`` call, then a text with ``\\boxed{42}``, on every build).
"""

from __future__ import annotations

import shutil
import tempfile
import uuid

import pytest
from paths import SUPPORT
from zygote_harness import zygote_env

from sandbox.isolation import SandboxConfig
from sandbox.zygote_client import Zygote

AGENT_DIR = SUPPORT / "node_agent"
AGENT = "exec:tests/support/node_agent/agent.mjs"


def _run_episodes(gw, config: SandboxConfig, n: int) -> list:
    if shutil.which("node") is None or not (AGENT_DIR / "node_modules" / "openai").is_dir():
        pytest.fail("needs node and tests/support/node_agent/node_modules (make test runs npm ci there)")
    log_dir = tempfile.mkdtemp(prefix="node-agent-")

    async def go() -> list:
        with zygote_env():
            zygote = await Zygote.start(AGENT, gw.zmq, config, log_dir)
        try:
            keys = [(f"node-{uuid.uuid4().hex[:8]}", None) for _ in range(n)]
            keys = [(eid, gw.gateway.open_session(eid)) for eid, _ in keys]
            outs = [await zygote.run_episode(eid, {"question": "What is 6*7?", "answer": "42"}, key, 60.0) for eid, key in keys]
            return [(o, key) for o, (_, key) in zip(outs, keys)]
        finally:
            await zygote.close()

    try:
        return gw.run(go(), timeout=300)
    finally:
        shutil.rmtree(log_dir, ignore_errors=True)


def test_node_agent_with_the_official_openai_client_runs_under_the_default_sandbox(served_scripted):
    gw = served_scripted
    results = _run_episodes(gw, SandboxConfig(), 4)
    for outcome, key in results:
        assert (outcome.status, outcome.reward) == ("ok", 1.0), outcome.error
        first, second = gw.interactions(key)  # the streamed tool call, then the streamed answer
        assert second.parent_id == first.id
        assert second.prompt_ids[: len(first.prompt_ids) + len(first.output_ids)] == first.prompt_ids + first.output_ids


def test_an_address_space_cap_is_what_failed_node(served_scripted):
    """The cause, kept visible: the old default cap (8 GiB of address space) fails the same agent."""
    ((outcome, _),) = _run_episodes(served_scripted, SandboxConfig(address_space_bytes=8 << 30), 1)
    assert outcome.status == "error" and "Out of memory" in outcome.log_tail, (outcome.error, outcome.log_tail)
