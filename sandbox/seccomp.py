"""A seccomp deny-list for agent processes, built with libseccomp through ctypes (no package).

Applied by ``sandbox.isolation`` as the very last layer, in the agent process (PID 1 of its PID
namespace), after capabilities are dropped and ``no_new_privs`` is set (the kernel requires one
of no_new_privs or CAP_SYS_ADMIN to load a filter; we always have no_new_privs first). The
filter is inherited by every process the agent forks and cannot be removed.

What the filter blocks (each returns EPERM unless noted; everything else is allowed):
- debugging other processes: ptrace, process_vm_readv, process_vm_writev, kcmp
- the mount table and the root: mount, umount2, pivot_root, chroot, mount_setattr, move_mount,
  open_tree, fsopen, fsconfig, fsmount, fspick
- new namespaces: unshare, setns, and clone() with any CLONE_NEW* flag. clone3 gets ENOSYS (its
  flags live in memory a filter cannot read); glibc then falls back to clone, which is checked.
- the kernel itself: kexec_load, kexec_file_load, init_module, finit_module, delete_module,
  reboot, swapon, swapoff, acct, quotactl, syslog, iopl, ioperm, settimeofday, clock_settime,
  clock_adjtime, adjtimex, sethostname, setdomainname, vhangup, lookup_dcookie, uselib, nfsservctl
- large attack surfaces the agent has no use for: bpf, perf_event_open, userfaultfd,
  io_uring_setup, io_uring_enter, io_uring_register, keyctl, add_key, request_key,
  open_by_handle_at, name_to_handle_at, fanotify_init
- syscalls of another ABI (32-bit int 0x80, x32): the process is killed (libseccomp's default
  action for a foreign architecture), so the deny-list cannot be bypassed by syscall number.

Not covered: a deny-list only removes what it names (a new kernel syscall is allowed until it
is added here); arguments are checked only for clone; socket families are not filtered (the
network namespace already leaves only loopback).
"""

from __future__ import annotations

import ctypes
import errno
import os

LIBSECCOMP = "libseccomp.so.2"
_SCMP_ACT_ALLOW = 0x7FFF0000
_SCMP_CMP_MASKED_EQ = 7
_CLONE_NEW_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
    "CLONE_NEWTIME": 0x00000080,
}

DENIED = (
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "kcmp",
    "mount",
    "umount2",
    "pivot_root",
    "chroot",
    "mount_setattr",
    "move_mount",
    "open_tree",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "unshare",
    "setns",
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "reboot",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "syslog",
    "iopl",
    "ioperm",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "adjtimex",
    "sethostname",
    "setdomainname",
    "vhangup",
    "lookup_dcookie",
    "uselib",
    "nfsservctl",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "open_by_handle_at",
    "name_to_handle_at",
    "fanotify_init",
)


class _ArgCmp(ctypes.Structure):
    _fields_ = [("arg", ctypes.c_uint), ("op", ctypes.c_int), ("datum_a", ctypes.c_uint64), ("datum_b", ctypes.c_uint64)]


def _errno_action(err: int) -> int:
    return 0x00050000 | (err & 0xFFFF)  # SCMP_ACT_ERRNO(err)


def _library() -> ctypes.CDLL:
    lib = ctypes.CDLL(LIBSECCOMP, use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_release.argtypes = [ctypes.c_void_p]
    lib.seccomp_export_bpf.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint, ctypes.POINTER(_ArgCmp)]
    return lib


def _add(lib: ctypes.CDLL, ctx: int, action: int, name: str, cmps: list[_ArgCmp] | None = None) -> bool:
    nr = lib.seccomp_syscall_resolve_name(name.encode())
    if nr < 0:  # not a syscall on this architecture (e.g. nfsservctl was removed): nothing to deny
        return False
    array = (_ArgCmp * len(cmps))(*cmps) if cmps else None
    rc = lib.seccomp_rule_add_array(ctx, action, nr, len(cmps or ()), array)
    if rc < 0:
        raise OSError(-rc, f"seccomp_rule_add({name}): {errno.errorcode.get(-rc, rc)}")
    return True


_compiled: bytes | None = None  # BPF program made by compile_filter(), loaded by install_filter()
_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER = 22, 2


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_char_p)]


def _build(lib: ctypes.CDLL, ctx: int) -> list[str]:
    eperm = _errno_action(errno.EPERM)
    denied = [name for name in DENIED if _add(lib, ctx, eperm, name)]
    if _add(lib, ctx, _errno_action(errno.ENOSYS), "clone3"):
        denied.append("clone3")
    for flag in _CLONE_NEW_FLAGS.values():  # one rule per flag: (flags & FLAG) == FLAG -> EPERM
        _add(lib, ctx, eperm, "clone", [_ArgCmp(0, _SCMP_CMP_MASKED_EQ, flag, flag)])
    denied.append("clone(CLONE_NEW*)")
    return denied


def compile_filter() -> list[str]:
    """Build the filter once (in the zygote) as raw BPF, so that each episode only loads it
    (libseccomp's rule compilation costs milliseconds on the spawn path); returns the denied
    syscalls. Loads nothing into the calling process."""
    global _compiled
    lib = _library()
    ctx = lib.seccomp_init(_SCMP_ACT_ALLOW)
    if not ctx:
        raise OSError(errno.ENOMEM, "seccomp_init failed")
    try:
        denied = _build(lib, ctx)
        r, w = os.pipe()
        try:
            rc = lib.seccomp_export_bpf(ctx, w)
            os.close(w)
            w = -1
            if rc < 0:
                raise OSError(-rc, f"seccomp_export_bpf: {errno.errorcode.get(-rc, rc)}")
            chunks = []
            while chunk := os.read(r, 1 << 16):
                chunks.append(chunk)
        finally:
            os.close(r)
            if w >= 0:
                os.close(w)
    finally:
        lib.seccomp_release(ctx)
    _compiled = b"".join(chunks)
    return denied


def install_filter() -> None:
    """Load the deny-list into the calling thread (and its future children). Uses the program
    from ``compile_filter`` when there is one, else compiles now. Raises OSError when libseccomp
    is missing or the kernel refuses the filter (no no_new_privs and no CAP_SYS_ADMIN)."""
    if _compiled is None:
        compile_filter()
    assert _compiled is not None
    program = _SockFprog(len(_compiled) // 8, _compiled)  # struct sock_filter is 8 bytes
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"prctl(PR_SET_SECCOMP): {os.strerror(err)}")
