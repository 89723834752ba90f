"""Sandboxed agent episodes: a zygote forks one isolated process per episode.

``Zygote`` (controller side, sandbox/zygote_client.py) starts ``python -m sandbox.zygote``
(sandbox/zygote.py), which imports the agent SDKs once and forks; sandbox/episode.py is what
runs in an episode around the agent; ``sandbox/isolation.py`` holds the layers,
``SandboxConfig`` and the allow-list of what an episode reaches (checked by sandbox/reach.py);
``sandbox/rootfs.py`` its minimal root; ``sandbox/seccomp.py`` the syscall deny-list;
``sandbox/keys.py`` keeps other episodes' session keys out of a forked episode's memory;
``sandbox/relay.py`` is the agent's only way out (HTTP on its own loopback, or ``ZmqTransport``
for httpx), both over ZeroMQ ipc:// to the gateway. ``sandbox/world.py`` gives an episode a task's
world (a private copy-on-write /workspace), ``sandbox/grader.py`` grades it in a fresh sandboxed
process (its checks' process: ``sandbox/check_runner.py``) and records the tripwires. tests/integration/sandbox/test_sandbox_attacks.py and
tests/integration/sandbox/test_sandbox_reach.py try one escape per test.
"""

from sandbox.isolation import SandboxConfig
from sandbox.zygote_client import Zygote, ZygoteDied

__all__ = ["SandboxConfig", "Zygote", "ZygoteDied"]
