"""A root file system for tasks with a world (task.json's "root", sandbox/world.py).

    python -m areal.tasks.root DEST [--suite bookworm] [--mirror URL] [--include git,make]
    python -m areal.tasks.root DEST --from-host sh,cat,ls,git

The first runs ``debootstrap --variant=minbase`` into DEST with, besides the packages named, the ones that
hold the shared libraries the sandbox's interpreter and its standard library's extension
modules link. The interpreter itself is not installed: the sandbox binds the host's into the
episode's root, where it loads its libraries from the root (tkinter's are left out). The suite
defaults to the host's (/etc/os-release), so the root's C library is as new as the one the
interpreter was built against. Needs root, ``debootstrap`` (``apt-get install debootstrap``) and
a Debian mirror; a few minutes and about 200 MB for minbase.

The second (``from_host``) needs neither: a small root of the host's own programs named, the
shared libraries they and the interpreter link (by ldd) and an /etc/os-release of its own; a
second or so and a few MB. Programs that read data files of their own (git's templates, locales)
may miss them there: debootstrap is the complete way.
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import shutil
import subprocess
import sys

MIRROR = "http://deb.debian.org/debian"


def interpreter_libraries() -> list[str]:
    """The shared libraries (as ldd names them) of this interpreter and its standard library's
    extension modules, tkinter's aside."""
    dynload = os.path.join(os.path.dirname(os.__file__), "lib-dynload")
    objects = [sys.executable, *(f for f in glob.glob(os.path.join(dynload, "*.so")) if "_tkinter" not in os.path.basename(f))]
    libs = {lib for path in objects for lib in _linked(path)}
    prefix = os.path.realpath(sys.base_prefix) + "/"
    return sorted(lib for lib in libs if not os.path.realpath(lib).startswith(prefix))  # libpython comes with the interpreter


def _linked(path: str) -> set[str]:
    """The shared libraries ``path`` links, the dynamic loader included, as ldd names them."""
    return set(re.findall(r"(/\S+\.so[.\d]*)", subprocess.run(["ldd", path], capture_output=True, text=True).stdout))


def packages_of(paths: list[str]) -> tuple[list[str], list[str]]:
    """(the Debian packages holding ``paths``, the paths no package holds), by ``dpkg -S``; a path
    is tried as named and under its merged-/usr spelling."""
    found: set[str] = set()
    missing: list[str] = []
    for path in paths:
        forms = {path, os.path.realpath(path)}
        forms |= {f.removeprefix("/usr") for f in list(forms) if f.startswith("/usr/")} | {"/usr" + f for f in list(forms)}
        owners = set()
        for form in sorted(forms):
            out = subprocess.run(["dpkg", "-S", form], capture_output=True, text=True)
            if out.returncode == 0:
                owners |= {line.split(":")[0] for line in out.stdout.splitlines() if ":" in line}
        found |= owners
        if not owners:
            missing.append(path)
    return sorted(found), missing


def from_host(dest: str, programs: list[str], release: str = "areal-task-root\n") -> str:
    """A small root file system at ``dest`` (made anew): ``programs`` (names on PATH, or paths),
    the shared libraries they, the interpreter and its standard library's extension modules link,
    at their real paths under the host's merged-/usr links, and ``release`` as /etc/os-release.
    The interpreter itself is not copied: the sandbox binds it in. Returns ``dest``."""
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    for name in ("bin", "lib", "lib64", "sbin"):  # the host's links (/bin -> usr/bin)
        if os.path.islink(f"/{name}"):
            os.symlink(os.readlink(f"/{name}"), f"{dest}/{name}")
    paths = [shutil.which(p) or p for p in programs]
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise ValueError(f"programs not found on this host: {missing}")
    named = {*paths, *interpreter_libraries(), *(lib for path in paths for lib in _linked(path))}
    for f in sorted(named):
        real = os.path.realpath(f)
        parent = os.path.realpath(os.path.dirname(dest + real))
        os.makedirs(parent, exist_ok=True)
        if not os.path.exists(dest + real):
            shutil.copy2(real, dest + real)
        if not os.path.exists(dest + f):  # a name that is a link on the host (/usr/bin/sh -> dash)
            at = os.path.realpath(os.path.dirname(dest + f))
            os.makedirs(at, exist_ok=True)
            os.symlink(real, os.path.join(at, os.path.basename(f)))
    os.makedirs(f"{dest}/etc", exist_ok=True)
    with open(f"{dest}/etc/os-release", "w") as f:
        f.write(release)
    for d in ("tmp", "proc", "dev", "root"):
        os.makedirs(f"{dest}/{d}", exist_ok=True)
    return dest


def host_suite() -> str:
    try:
        text = open("/etc/os-release").read()
    except OSError:
        return "bookworm"
    m = re.search(r"^VERSION_CODENAME=(\w+)", text, re.M)
    return m.group(1) if m else "bookworm"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m areal.tasks.root", description=__doc__.split("\n\n")[0])
    ap.add_argument("dest", help="the directory to make (must not exist, or be empty)")
    ap.add_argument("--suite", default=host_suite(), help="the Debian suite (default: the host's)")
    ap.add_argument("--mirror", default=MIRROR)
    ap.add_argument("--include", default="", help="more packages, comma-separated (git, make, ...)")
    ap.add_argument("--from-host", default="", help="no debootstrap: a small root of these host programs, comma-separated")
    args = ap.parse_args(argv)
    if os.path.exists(args.dest) and (not os.path.isdir(args.dest) or os.listdir(args.dest)):
        sys.exit(f"python -m areal.tasks.root: {args.dest} exists and is not an empty directory")
    if args.from_host:
        try:
            from_host(args.dest, [p for p in args.from_host.split(",") if p])
        except ValueError as e:
            sys.exit(f"python -m areal.tasks.root: {e}")
        print(f'{args.dest}: a root file system of host programs; name it in a task.json as "root"')
        return 0
    if os.geteuid() != 0:
        sys.exit("python -m areal.tasks.root: debootstrap needs root")
    if shutil.which("debootstrap") is None:
        sys.exit("python -m areal.tasks.root: debootstrap is not installed (apt-get install debootstrap)")
    packages, missing = packages_of(interpreter_libraries()) if shutil.which("dpkg") else ([], ["(no dpkg on this host)"])
    if missing:
        print(f"no Debian package found for {missing}: install what provides them into the root yourself", file=sys.stderr)
    include = sorted({*packages, *(p for p in args.include.split(",") if p)})
    cmd = ["debootstrap", "--variant=minbase", f"--include={','.join(include)}", args.suite, args.dest, args.mirror]
    print(" ".join(cmd), flush=True)
    rc = subprocess.run(cmd).returncode
    if rc == 0:
        print(f'{args.dest}: a root file system; name it in a task.json as "root"')
    return rc


if __name__ == "__main__":
    sys.exit(main())
