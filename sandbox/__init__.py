"""Sandboxed agent episodes: a zygote forks one isolated process per episode.

``Zygote`` (controller side, sandbox/zygote.py) starts ``python -m sandbox.zygote``, which
imports the agent SDKs once and forks; ``sandbox/isolation.py`` holds the layers and
``SandboxConfig``; ``sandbox/seccomp.py`` the syscall deny-list; ``sandbox/keys.py`` keeps other
episodes' session keys out of a forked episode's memory; ``sandbox/relay.py`` is the agent's
only way out (HTTP on its own loopback, or ``ZmqTransport`` for httpx), both over ZeroMQ
ipc:// to the gateway. tests/test_sandbox_attacks.py tries one escape per test.

``Zygote`` is imported lazily: an eager import would load sandbox.zygote twice when it runs as
``python -m sandbox.zygote`` (once as a package member, once as __main__).
"""

from typing import Any

from sandbox.isolation import SandboxConfig

__all__ = ["SandboxConfig", "Zygote", "ZygoteDied"]


def __getattr__(name: str) -> Any:
    if name in ("Zygote", "ZygoteDied"):
        from sandbox import zygote

        return getattr(zygote, name)
    raise AttributeError(f"module 'sandbox' has no attribute {name!r}")
