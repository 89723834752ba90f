"""How the zygote forks episodes: once per episode, straight into the PID namespace, from a
heap backed by huge pages (sandbox/heap.py, isolation.fork_pid_namespace_init). Real zygotes,
real forks; the huge-page figures themselves are in benchmarks/sandbox_kernel.py."""

from __future__ import annotations

import asyncio
import os
import re
import time
from collections.abc import Iterator

import pytest
import zmq
from zygote_harness import children_of, zygote_env

from sandbox import heap
from sandbox.isolation import SandboxConfig
from sandbox.zygote_client import Zygote

MAPS = """\
55d000000000-55d000a00000 rw-p 00000000 00:00 0                          [heap]
7f0000100000-7f0000900000 rw-p 00000000 00:00 0
7f0001000000-7f0001100000 rw-p 00000000 00:00 0
7f0002000000-7f0002400000 r--p 00000000 08:01 123                        /usr/lib/libc.so.6
7f0003000000-7f0003400000 rw-p 00000000 08:01 124                        /usr/lib/libc.so.6
7f0004000000-7f0004400000 rw-s 00000000 00:05 1                          /dev/zero (deleted)
7ffc00000000-7ffc00400000 rw-p 00000000 00:00 0                          [stack]
"""


def test_collapse_ranges_are_the_aligned_parts_of_private_anonymous_rw_mappings():
    huge = heap.HUGE_PAGE
    assert heap._private_anonymous_ranges(MAPS) == [
        (0x55D000000000, 0x55D000A00000 // huge * huge),  # [heap]: 10 MiB, 5 huge pages
        (0x7F0000200000, 0x7F0000800000),  # unaligned both ends: the 3 whole huge pages inside
    ]  # a 1 MiB mapping, file-backed, read-only, shared and [stack] mappings: none


def test_collapse_heap_reports_what_it_did_and_never_raises():
    """Refusals (an old kernel, an ineligible mapping) are counted, not raised."""
    keep = bytearray(8 << 20)  # at least one collapsible range, touched
    keep[::4096] = b"x" * len(keep[::4096])
    done, refused = heap.collapse_heap()
    assert done >= 0 and refused >= 0
    assert done % heap.HUGE_PAGE == 0 and refused % heap.HUGE_PAGE == 0
    assert done + refused > 0  # the buffer above lies in some range that was tried
    assert keep[4096] == ord("x")  # collapsing moves pages, never their contents


@pytest.fixture
def gateway_addr(tmp_path) -> Iterator[str]:
    """A ROUTER on an ipc:// path: the zygote needs the address only (no episode runs here)."""
    ctx = zmq.Context()
    router = ctx.socket(zmq.ROUTER)
    router.bind(f"ipc://{tmp_path}/gw.sock")
    yield f"ipc://{tmp_path}/gw.sock"
    router.close(0)
    ctx.term()


def _ns_pids(pid: int) -> list[int]:
    line = next(x for x in open(f"/proc/{pid}/status") if x.startswith("NSpid:"))
    return [int(p) for p in line.split()[1:]]


@pytest.mark.skipif(os.geteuid() != 0, reason="a non-root zygote forks into the PID namespace inside the slot's user namespace")
def test_root_zygote_forks_each_slot_as_pid_1_of_its_own_namespace(tmp_path, gateway_addr):
    """Each warm slot is a direct child of the zygote, PID 1 of a namespace of its own, with no
    process between them and none under it while idle; and the zygote's own next fork (the
    reporter, the next slot) is not in that namespace."""

    async def main() -> None:
        with zygote_env():
            zygote = await Zygote.start(
                "sandbox_agents:function_agent", gateway_addr, SandboxConfig(deadline_s=30.0, warm_slots=3), str(tmp_path / "log")
            )
        try:
            assert "pidns" in zygote.ready.isolation, zygote.ready.warnings
            deadline = time.monotonic() + 30
            while len(slots := children_of(zygote.ready.pid)) < 3 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.5)  # their setup: a slot in the two-fork scheme forked its agent by now
            assert len(slots) == 3, slots
            namespaces = set()
            for pid in slots:
                assert _ns_pids(pid) == [pid, 1]
                assert children_of(pid) == []  # idle: no agent process under it
                namespaces.add(os.readlink(f"/proc/{pid}/ns/pid"))
            assert len(namespaces) == 3  # one namespace per slot
            zpid = zygote.ready.pid
            assert os.readlink(f"/proc/{zpid}/ns/pid_for_children") == os.readlink(f"/proc/{zpid}/ns/pid")
        finally:
            await zygote.close()

    asyncio.run(main())


def test_huge_pages_switch(tmp_path, gateway_addr):
    """The fast path's switch: on, the zygote's log says how much it collapsed; off, nothing."""

    async def start(huge: bool, log_dir: str) -> str:
        with zygote_env():
            zygote = await Zygote.start(
                "sandbox_agents:function_agent", gateway_addr, SandboxConfig(deadline_s=30.0, warm_slots=0, huge_pages=huge), log_dir
            )
        await zygote.close()
        return open(zygote.stderr_path).read()

    on = asyncio.run(start(True, str(tmp_path / "on")))
    off = asyncio.run(start(False, str(tmp_path / "off")))
    assert re.search(r"heap: \d+ MiB collapsed into huge pages, \d+ MiB refused", on), on
    assert "huge pages" not in off, off
