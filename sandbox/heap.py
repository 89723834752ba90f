"""The zygote's preloaded heap, backed by huge pages so that forking it and tearing a fork down is cheap.

Every episode process is a fork of the zygote, which holds the agent SDKs (on the order of 100 MiB
of Python objects). A fork copies one page-table entry per resident 4 KiB page and takes a
reference on each page; the child's exit drops them again. Both are kernel time paid per
episode, proportional to the zygote's resident memory, whatever the agent does. Once the
preloaded heap is collapsed into transparent huge pages (``madvise(MADV_COLLAPSE)``, Linux 6.1+),
a fork copies one entry per 2 MiB instead. Nothing else changes: a write by either side still
copies only the 4 KiB page it touches (the kernel splits the huge mapping of the writer first),
so isolation between the zygote and its episodes and between episodes is the same.

    zygote: preload SDKs · gc.freeze() · collapse_heap() ──fork──► episode (page tables: 1 entry / 2 MiB)

Covered: the private anonymous read-write mappings present at the call (the C heap, pymalloc's
arenas, mmap'd buffers), in their 2 MiB-aligned parts. Not covered: memory allocated later
(small: the zygote's loop), mappings the kernel refuses (thread stacks, reserved-but-unused
arena space answer EINVAL; a kernel without MADV_COLLAPSE collapses nothing). The collapse is
an optimisation: a refusal is counted, never an error. Where the zygote later writes to a page
still shared with a live episode, its huge mapping is split again; the figures in
benchmarks/sandbox_kernel.py are taken in that steady state.
"""

from __future__ import annotations

import ctypes
import errno

_MADV_COLLAPSE = 25  # include/uapi/asm-generic/mman-common.h
HUGE_PAGE = 2 << 20
_libc = ctypes.CDLL(None, use_errno=True)
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]


def _private_anonymous_ranges(maps: str) -> list[tuple[int, int]]:
    """The 2 MiB-aligned parts of the private anonymous rw mappings listed in ``maps``
    (the text of /proc/self/maps)."""
    out = []
    for line in maps.splitlines():
        fields = line.split()
        path = fields[5] if len(fields) > 5 else ""
        if fields[1] != "rw-p" or path not in ("", "[heap]"):
            continue
        lo, hi = (int(x, 16) for x in fields[0].split("-"))
        start, end = (lo + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1), hi & ~(HUGE_PAGE - 1)
        if end > start:
            out.append((start, end))
    return out


def collapse_heap() -> tuple[int, int]:
    """Collapse this process's private anonymous memory into huge pages; returns (bytes
    collapsed, bytes refused). Call once, after the preloading and before the first fork."""
    with open("/proc/self/maps") as f:
        ranges = _private_anonymous_ranges(f.read())
    done = refused = 0
    for start, end in ranges:
        if _libc.madvise(start, end - start, _MADV_COLLAPSE) == 0:
            done += end - start
            continue
        if ctypes.get_errno() == errno.EINVAL and end - start > HUGE_PAGE:
            # One ineligible huge page fails the whole range: try its pages one by one.
            for page in range(start, end, HUGE_PAGE):
                ok = _libc.madvise(page, HUGE_PAGE, _MADV_COLLAPSE) == 0
                done, refused = done + HUGE_PAGE * ok, refused + HUGE_PAGE * (not ok)
        else:
            refused += end - start
    return done, refused
